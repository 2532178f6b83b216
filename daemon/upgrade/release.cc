#include "daemon/upgrade/release.h"

#include <charconv>

#include "fmt/format.h"
#include "pki/keys.h"
#include "proto/absl_compat.h"
#include "proto/signing_input.h"

namespace bcd::upgrade {
namespace {

bool AllDigits(std::string_view text) {
  return !text.empty() && text.find_first_not_of("0123456789") == std::string_view::npos;
}

// A numeric part: digits, no leading zero (semver 2.0.0 §2), fits 64 bits.
std::optional<uint64_t> Number(std::string_view text) {
  if (!AllDigits(text) || (text.size() > 1 && text[0] == '0')) return std::nullopt;
  uint64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

std::vector<std::string_view> Split(std::string_view text, char separator) {
  std::vector<std::string_view> parts;
  for (std::size_t start = 0;;) {
    std::size_t at = text.find(separator, start);
    parts.push_back(text.substr(start, at - start));
    if (at == std::string_view::npos) return parts;
    start = at + 1;
  }
}

}  // namespace

std::optional<Semver> Semver::Parse(std::string_view text) {
  if (text.empty() || text.size() > 128) return std::nullopt;
  std::size_t dash = text.find('-');
  std::vector<std::string_view> core = Split(text.substr(0, dash), '.');
  if (core.size() != 3) return std::nullopt;
  Semver version;
  std::optional<uint64_t> major = Number(core[0]), minor = Number(core[1]), patch = Number(core[2]);
  if (!major || !minor || !patch) return std::nullopt;
  version.major = *major;
  version.minor = *minor;
  version.patch = *patch;
  if (dash == std::string_view::npos) return version;
  for (std::string_view id : Split(text.substr(dash + 1), '.')) {
    bool ok =
        !id.empty() &&
        id.find_first_not_of("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-") ==
            std::string_view::npos &&
        !(AllDigits(id) && id.size() > 1 && id[0] == '0');
    if (!ok) return std::nullopt;
    version.pre.emplace_back(id);
  }
  return version;
}

std::string Semver::ToString() const {
  std::string text = fmt::format("{}.{}.{}", major, minor, patch);
  for (std::size_t i = 0; i < pre.size(); ++i) text += (i == 0 ? "-" : ".") + pre[i];
  return text;
}

int Compare(const Semver& a, const Semver& b) {
  for (auto [x, y] : {std::pair{a.major, b.major}, {a.minor, b.minor}, {a.patch, b.patch}}) {
    if (x != y) return x < y ? -1 : 1;
  }
  // A pre-release is lower than its release; identifiers compare in order, numbers numerically
  // and below text, text in ASCII order; a longer list wins when all before are equal.
  if (a.pre.empty() || b.pre.empty())
    return a.pre.empty() == b.pre.empty() ? 0 : a.pre.empty() ? 1 : -1;
  for (std::size_t i = 0; i < a.pre.size() && i < b.pre.size(); ++i) {
    const std::string &x = a.pre[i], &y = b.pre[i];
    bool xn = AllDigits(x), yn = AllDigits(y);
    if (xn && yn) {
      if (x.size() != y.size()) return x.size() < y.size() ? -1 : 1;
      if (x != y) return x < y ? -1 : 1;
    } else if (xn != yn) {
      return xn ? -1 : 1;
    } else if (x != y) {
      return x < y ? -1 : 1;
    }
  }
  if (a.pre.size() == b.pre.size()) return 0;
  return a.pre.size() < b.pre.size() ? -1 : 1;
}

std::string OsArch(std::string_view machine) {
  if (machine == "x86_64") return "linux/amd64";
  if (machine == "aarch64" || machine == "arm64") return "linux/arm64";
  return "";
}

absl::Status VerifyRelease(const bettercompute::agent::v1::DaemonUpgradePayload& payload,
                           const ReleasePolicy& policy) {
  if (policy.pins.empty()) {
    return absl::UnimplementedError(
        "no release keys are pinned ([update] release_keys): this node's bcd cannot be upgraded "
        "by command; replace the binary by hand, or pin the release keys");
  }
  std::optional<Semver> version = Semver::Parse(payload.version());
  if (!version) {
    return absl::InvalidArgumentError(fmt::format(
        "version \"{}\" is not semver (MAJOR.MINOR.PATCH[-PRE])", payload.version().substr(0, 64)));
  }
  if (payload.sha256().size() != 32) {
    return absl::InvalidArgumentError(
        fmt::format("sha256 must be 32 bytes, got {}", payload.sha256().size()));
  }
  if (!payload.url().starts_with("https://") || payload.url().size() <= 8) {
    return absl::InvalidArgumentError(
        fmt::format("the url must be https://..., got \"{}\"", payload.url().substr(0, 64)));
  }
  if (policy.os_arch.empty()) {
    return absl::FailedPreconditionError("this machine's architecture has no releases");
  }
  // The key: pinned by its SPKI sha256, or equal to a pinned PEM key.
  absl::StatusOr<pki::PublicKey> key = pki::PublicKey::FromSpkiDer(payload.release_key_spki());
  if (payload.release_key_spki().empty() || !key.ok()) {
    return absl::InvalidArgumentError("release_key_spki is not a P-256 public key (SPKI DER)");
  }
  std::string spki_sha256 = pki::Sha256(payload.release_key_spki());
  if (!payload.release_key().empty() && payload.release_key() != pki::Hex(spki_sha256)) {
    return absl::InvalidArgumentError("release_key does not name the sha256 of release_key_spki");
  }
  bool pinned = false;
  for (const ReleaseKey& pin : policy.pins) {
    if (const auto* hash = std::get_if<Sha256Pin>(&pin)) {
      pinned |= std::string(hash->bytes().begin(), hash->bytes().end()) == spki_sha256;
    } else if (policy.read_file) {
      const auto& path = std::get<std::filesystem::path>(pin);
      absl::StatusOr<std::string> pem = policy.read_file(path);
      absl::StatusOr<pki::PublicKey> pinned_key =
          pem.ok() ? pki::PublicKey::FromPem(*pem) : absl::StatusOr<pki::PublicKey>(pem.status());
      pinned |= pinned_key.ok() && pinned_key->SpkiDer() == payload.release_key_spki();
    }
  }
  if (!pinned) {
    return absl::PermissionDeniedError(
        fmt::format("the release key (SPKI sha256 {}) is not one of [update] release_keys",
                    pki::Hex(spki_sha256)));
  }
  std::string input =
      proto::ReleaseSigningInput(payload.version(), policy.os_arch, payload.sha256());
  if (!key->VerifyEs256(input, payload.signature()).ok()) {
    return absl::PermissionDeniedError(fmt::format(
        "the signature does not verify for version {} on {} with the pinned release key",
        payload.version(), policy.os_arch));
  }
  std::optional<Semver> running = Semver::Parse(policy.running);
  if (running && Compare(*version, *running) == 0) {
    return absl::FailedPreconditionError(
        fmt::format("version {} is the one running: nothing to install", payload.version()));
  }
  for (const std::optional<Semver>& floor : {policy.highest, running}) {
    if (floor && Compare(*version, *floor) < 0) {
      return absl::FailedPreconditionError(fmt::format(
          "version {} is lower than {}, which ran here: an older release is never installed",
          payload.version(), floor->ToString()));
    }
  }
  return absl::OkStatus();
}

}  // namespace bcd::upgrade
