#include "pki/jwt.h"

#include <charconv>

#include "base/files.h"
#include "fmt/format.h"
#include "pki/base64url.h"
#include "pki/jose_util.h"
#include "proto/absl_compat.h"

namespace bcd::pki {
namespace {

using nlohmann::json;

absl::Status Refuse(const std::string& message) {
  return absl::UnauthenticatedError("tunnel ticket refused: " + message);
}

std::optional<std::string> StringClaim(const json& claims, const char* name) {
  return StringMember(claims, name);
}

std::optional<int64_t> IntClaim(const json& claims, const char* name) {
  auto it = claims.find(name);
  // Unsigned values above INT64_MAX would wrap: not a time or a port anyone means.
  if (it == claims.end() || !it->is_number_integer() ||
      (it->is_number_unsigned() && it->get<uint64_t>() > uint64_t{INT64_MAX})) {
    return std::nullopt;
  }
  return it->get<int64_t>();
}

std::optional<uint16_t> PortClaim(const json& claims, const char* name, uint16_t min) {
  std::optional<int64_t> value = IntClaim(claims, name);
  if (!value || *value < min || *value > 65535) return std::nullopt;
  return static_cast<uint16_t>(*value);
}

// The key `kid` names in the JWKS, when it is an EC P-256 key.
absl::StatusOr<PublicKey> FindKey(std::string_view jwks_json, std::string_view kid) {
  std::optional<json> jwks = ParseJsonObject(jwks_json, 64 * 1024);
  if (!jwks || !jwks->contains("keys") || !(*jwks)["keys"].is_array()) {
    return Refuse("the access section's JWKS is not a JSON object with a keys array");
  }
  for (const json& jwk : (*jwks)["keys"]) {
    if (StringMember(jwk, "kid") != kid) continue;
    std::optional<std::string> x_text = StringMember(jwk, "x"), y_text = StringMember(jwk, "y");
    if (StringMember(jwk, "kty") != "EC" || StringMember(jwk, "crv") != "P-256" || !x_text ||
        !y_text) {
      return Refuse(fmt::format("JWKS key \"{}\" is not an EC P-256 key", kid));
    }
    std::optional<std::string> x = Base64UrlDecode(*x_text);
    std::optional<std::string> y = Base64UrlDecode(*y_text);
    absl::StatusOr<PublicKey> key =
        x && y ? PublicKey::FromXY(*x, *y) : absl::InvalidArgumentError("not base64url");
    if (!key.ok())
      return Refuse(fmt::format("JWKS key \"{}\": {}", kid, ToStd(key.status().message())));
    return key;
  }
  return Refuse(fmt::format("kid \"{}\" is not in the access section's JWKS", kid));
}

}  // namespace

absl::StatusOr<std::size_t> CheckJwks(std::string_view jwks_json) {
  std::optional<json> jwks = ParseJsonObject(jwks_json, 64 * 1024);
  if (!jwks || !jwks->contains("keys") || !(*jwks)["keys"].is_array()) {
    return absl::InvalidArgumentError("the JWKS is not a JSON object with a keys array");
  }
  std::size_t count = 0;
  for (const json& jwk : (*jwks)["keys"]) {
    std::optional<std::string> kid = StringMember(jwk, "kid");
    if (!kid) return absl::InvalidArgumentError(fmt::format("JWKS key {} has no kid", count));
    absl::StatusOr<PublicKey> key = FindKey(jwks_json, *kid);
    if (!key.ok()) {
      std::string_view why = ToStd(key.status().message());
      why.remove_prefix(std::min(why.size(), std::string_view("tunnel ticket refused: ").size()));
      return absl::InvalidArgumentError(std::string(why));
    }
    ++count;
  }
  return count;
}

namespace {

// The claims of a compact JWS whose header allows ES256 only and whose signature verifies under
// the JWKS key its kid names.
absl::StatusOr<json> VerifiedClaims(std::string_view compact, std::string_view jwks_json) {
  if (compact.size() > kMaxTicketBytes) {
    return Refuse(fmt::format("{} bytes is over the bound of {}", compact.size(), kMaxTicketBytes));
  }
  std::vector<std::string_view> parts = SplitCompact(compact);
  if (parts.size() != 3)
    return Refuse(fmt::format("a compact JWS has 3 parts, got {}", parts.size()));
  std::optional<std::string> header_text = Base64UrlDecode(parts[0]);
  std::optional<json> header = header_text ? ParseJsonObject(*header_text, 4096) : std::nullopt;
  if (!header) return Refuse("the header is not base64url of a JSON object");
  std::optional<std::string> alg = StringClaim(*header, "alg");
  if (alg != "ES256")
    return Refuse(fmt::format("alg \"{}\" is not allowed (ES256 only)", alg.value_or("")));
  if (header->contains("crit")) return Refuse("header member \"crit\" is not allowed");
  std::optional<std::string> kid = StringClaim(*header, "kid");
  if (!kid) return Refuse("the header names no kid");
  absl::StatusOr<PublicKey> key = FindKey(jwks_json, *kid);
  if (!key.ok()) return key.status();
  std::optional<std::string> signature = Base64UrlDecode(parts[2]);
  if (!signature) return Refuse("the signature is not base64url");
  std::string signed_part = std::string(parts[0]) + "." + std::string(parts[1]);
  // JOSE signers do not normalise s, so both halves are accepted here.
  if (absl::Status s = key->VerifyEs256(signed_part, *signature, HighS::kAllow); !s.ok()) {
    return Refuse(fmt::format("signature: {}", ToStd(s.message())));
  }
  std::optional<std::string> payload_text = Base64UrlDecode(parts[1]);
  std::optional<json> claims = payload_text ? ParseJsonObject(*payload_text, 8192) : std::nullopt;
  if (!claims) return Refuse("the claims are not base64url of a JSON object");
  return *std::move(claims);
}

// Audience, lifetime and clock, session and tunnel: the ticket is for this tunnel, now.
absl::Status CheckBinding(const json& claims, const TicketExpectation& expect) {
  std::string audience = fmt::format("node:{}", expect.node_id);
  auto aud = claims.find("aud");
  bool aud_ok = aud != claims.end() &&
                ((aud->is_string() && *aud == audience) ||
                 (aud->is_array() && std::find(aud->begin(), aud->end(), audience) != aud->end()));
  if (!aud_ok) {
    return Refuse(fmt::format("aud {} is not \"{}\"", aud == claims.end() ? "(none)" : aud->dump(),
                              audience));
  }
  std::optional<int64_t> iat = IntClaim(claims, "iat"), exp = IntClaim(claims, "exp");
  if (!iat || !exp) return Refuse("iat and exp must be integers");
  if (*exp <= *iat || *exp - *iat > kTicketMaxLifetime) {
    return Refuse(fmt::format("lifetime exp - iat = {} s is not within 1..{} s", *exp - *iat,
                              kTicketMaxLifetime));
  }
  if (expect.now > *exp + kTicketClockSkew) {
    return Refuse(fmt::format("it expired at {} (now {})", *exp, expect.now));
  }
  if (*iat > expect.now + kTicketClockSkew) {
    return Refuse(fmt::format("it is issued in the future, at {} (now {})", *iat, expect.now));
  }
  if (StringClaim(claims, "sid") != expect.session_id) {
    return Refuse(fmt::format("sid \"{}\" is not this session's \"{}\"",
                              StringClaim(claims, "sid").value_or(""), expect.session_id));
  }
  if (StringClaim(claims, "tid") != expect.tunnel_id) {
    return Refuse(fmt::format("tid \"{}\" is not the tunnel id \"{}\"",
                              StringClaim(claims, "tid").value_or(""), expect.tunnel_id));
  }
  return absl::OkStatus();
}

// What the op needs, as the ticket's claims give it.
struct OpClaims {
  std::string op, host, instance;
  std::vector<std::string> cmd;
  uint16_t port = 0, rows = 0, cols = 0;
};

absl::StatusOr<OpClaims> ReadOp(const json& claims) {
  OpClaims out;
  std::optional<std::string> op = StringClaim(claims, "op");
  if (op == "exec") {
    auto cmd = claims.find("cmd");
    if (cmd == claims.end() || !cmd->is_array() || cmd->empty()) {
      return Refuse("an exec ticket needs cmd, a non-empty array of strings");
    }
    for (const json& arg : *cmd) {
      if (!arg.is_string()) return Refuse("an exec ticket needs cmd, a non-empty array of strings");
      out.cmd.push_back(arg.get<std::string>());
    }
  } else if (op == "tcp" || op == "instance-tcp") {
    const char* target = op == "tcp" ? "host" : "instance";
    std::optional<std::string> name = StringClaim(claims, target);
    std::optional<uint16_t> port = PortClaim(claims, "port", 1);
    if (!name || name->empty() || !port) {
      return Refuse(fmt::format("a {} ticket needs {} and a port from 1 to 65535", *op, target));
    }
    (op == "tcp" ? out.host : out.instance) = *name;
    out.port = *port;
  } else if (op == "shell") {
    for (auto [name, field] : {std::pair{"rows", &out.rows}, std::pair{"cols", &out.cols}}) {
      if (!claims.contains(name)) continue;
      std::optional<uint16_t> value = PortClaim(claims, name, 1);
      if (!value || *value > 10000)
        return Refuse(fmt::format("{} must be an integer from 1 to 10000", name));
      *field = *value;
    }
  } else {
    return Refuse(
        fmt::format("op \"{}\" is not shell, exec, tcp or instance-tcp", op.value_or("")));
  }
  out.op = *op;
  return out;
}

}  // namespace

absl::StatusOr<TunnelTicket> TunnelTicket::Verify(std::string_view compact,
                                                  std::string_view jwks_json,
                                                  const TicketExpectation& expect) {
  absl::StatusOr<json> claims = VerifiedClaims(compact, jwks_json);
  if (!claims.ok()) return claims.status();
  if (absl::Status s = CheckBinding(*claims, expect); !s.ok()) return s;
  std::optional<std::string> jti = StringClaim(*claims, "jti");
  if (!jti || jti->empty() || jti->size() > 256) return Refuse("jti is missing, empty or too long");
  absl::StatusOr<OpClaims> op = ReadOp(*claims);
  if (!op.ok()) return op.status();
  TunnelTicket ticket;
  ticket.op_ = std::move(op->op);
  ticket.cmd_ = std::move(op->cmd);
  ticket.host_ = std::move(op->host);
  ticket.instance_ = std::move(op->instance);
  ticket.port_ = op->port;
  ticket.rows_ = op->rows;
  ticket.cols_ = op->cols;
  ticket.jti_ = *jti;
  ticket.exp_ = *IntClaim(*claims, "exp");
  return ticket;
}

absl::StatusOr<JtiSet> JtiSet::Load(const std::filesystem::path& path) {
  JtiSet set(path);
  absl::StatusOr<std::string> text = ReadWholeFile(path, 64u << 20);
  if (absl::IsNotFound(text.status())) return set;
  if (!text.ok()) return text.status();
  std::string_view rest = *text;
  for (int line = 1; !rest.empty(); ++line) {
    std::size_t nl = rest.find('\n');
    std::string_view entry = rest.substr(0, nl);
    rest = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);
    if (entry.starts_with("F ")) {  // the floor
      auto [end, ec] = std::from_chars(entry.data() + 2, entry.data() + entry.size(), set.floor_);
      if (ec != std::errc() || end != entry.data() + entry.size()) {
        return absl::DataLossError(fmt::format("{}:{}: corrupt jti floor", path.string(), line));
      }
      continue;
    }
    std::size_t space = entry.find(' ');
    int64_t exp = 0;
    auto [end, ec] =
        std::from_chars(entry.data(), entry.data() + std::min(space, entry.size()), exp);
    if (space == std::string_view::npos || ec != std::errc() || end != entry.data() + space ||
        space + 1 >= entry.size()) {
      return absl::DataLossError(fmt::format("{}:{}: corrupt jti entry", path.string(), line));
    }
    set.entries_.emplace(std::string(entry.substr(space + 1)), exp);
  }
  return set;
}

absl::Status JtiSet::Use(const TunnelTicket& ticket, int64_t now) {
  return Use(ticket.jti(), ticket.exp(), now);
}

absl::Status JtiSet::Use(std::string_view jti, int64_t exp, int64_t now) {
  if (entries_.contains(jti))
    return absl::AlreadyExistsError(
        fmt::format("tunnel ticket refused: jti \"{}\" was used before", jti));
  if (exp <= floor_) {
    return absl::FailedPreconditionError(fmt::format(
        "tunnel ticket refused: it expired at {}, no later than tickets whose jti were forgotten "
        "(until {}); its jti cannot be checked",
        exp, floor_));
  }
  std::erase_if(entries_, [&](const auto& entry) {
    if (entry.second + kTicketClockSkew >= now) return false;
    floor_ = std::max(floor_, entry.second);
    return true;
  });
  if (exp <= floor_) {
    return absl::FailedPreconditionError(
        fmt::format("tunnel ticket refused: it expired at {} (now {})", exp, now));
  }
  if (entries_.size() >= kMaxEntries) {
    return absl::ResourceExhaustedError("tunnel ticket refused: too many unexpired tickets in use");
  }
  if (jti.find_first_of("\n\r") != std::string_view::npos) {
    return absl::InvalidArgumentError("tunnel ticket refused: jti has a line break");
  }
  auto [it, inserted] = entries_.emplace(std::string(jti), exp);
  std::string text = floor_ > 0 ? fmt::format("F {}\n", floor_) : "";
  for (const auto& [id, expiry] : entries_) text += fmt::format("{} {}\n", expiry, id);
  if (absl::Status status = AtomicWriteFile(path_, text, 0600); !status.ok()) {
    entries_.erase(it);  // not remembered on disk: refuse rather than allow a replay after restart
    return status;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> SignJwt(std::string_view claims_json, const PrivateKey& key,
                                    std::string_view kid) {
  json header = {{"alg", "ES256"}, {"kid", kid}, {"typ", "JWT"}};
  std::string signed_part = Base64UrlEncode(header.dump()) + "." + Base64UrlEncode(claims_json);
  absl::StatusOr<std::string> signature = key.SignEs256(signed_part);
  if (!signature.ok()) return signature.status();
  return signed_part + "." + Base64UrlEncode(*signature);
}

std::string JwksOf(const PublicKey& key, std::string_view kid) {
  std::string point = key.Sec1();
  json jwk = {{"kty", "EC"},
              {"crv", "P-256"},
              {"kid", kid},
              {"alg", "ES256"},
              {"use", "sig"},
              {"x", Base64UrlEncode(std::string_view(point).substr(1, 32))},
              {"y", Base64UrlEncode(std::string_view(point).substr(33, 32))}};
  return json{{"keys", json::array({jwk})}}.dump();
}

}  // namespace bcd::pki
