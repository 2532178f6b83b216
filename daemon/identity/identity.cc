#include "daemon/identity/identity.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>

#include "base/files.h"
#include "base/version.h"
#include "fmt/format.h"
#include "nlohmann/json.hpp"
#include "pki/files.h"
#include "pki/trust.h"
#include "proto/absl_compat.h"
#include "proto/frame_codec.h"

namespace bcd {

absl::StatusOr<StateDir> StateDir::Open(const std::filesystem::path& path) {
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0) {
    if (errno != ENOENT) {
      return absl::PermissionDeniedError(
          fmt::format("cannot read the state dir {}: {}", path.string(), std::strerror(errno)));
    }
    std::error_code ec;
    if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path(), ec);
    if (ec || (mkdir(path.c_str(), 0700) != 0 && errno != EEXIST)) {
      return absl::InternalError(fmt::format("cannot create the state dir {}: {}", path.string(),
                                             ec ? ec.message() : std::strerror(errno)));
    }
    if (lstat(path.c_str(), &st) != 0) {
      return absl::InternalError(
          fmt::format("cannot read the state dir {}: {}", path.string(), std::strerror(errno)));
    }
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        fmt::format("state dir {} is not a directory{}: point state_dir at a directory of its own",
                    path.string(), S_ISLNK(st.st_mode) ? " (a symbolic link)" : ""));
  }
  if (st.st_uid != geteuid()) {
    return absl::PermissionDeniedError(fmt::format(
        "state dir {} belongs to uid {}, and bcd runs as uid {}: run bcd as its owner, or give "
        "bcd a directory of its own (chown {} {})",
        path.string(), st.st_uid, geteuid(), geteuid(), path.string()));
  }
  if ((st.st_mode & 077) != 0) {
    return absl::PermissionDeniedError(fmt::format(
        "state dir {} has mode {:04o}: group and others must have no access (chmod 700 {}), or "
        "point state_dir at a directory of its own",
        path.string(), st.st_mode & 07777, path.string()));
  }
  return StateDir(path);
}

StateDirLock::~StateDirLock() {
  if (fd_ >= 0) close(fd_);
}

absl::StatusOr<StateDirLock> StateDir::Lock() const {
  std::filesystem::path file = path_ / "bcd.lock";
  int fd = open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    return absl::InternalError(
        fmt::format("cannot open {}: {}", file.string(), std::strerror(errno)));
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    int error = errno;
    close(fd);
    if (error == EWOULDBLOCK) {
      return absl::FailedPreconditionError(
          fmt::format("another bcd is already running on {}", path_.string()));
    }
    return absl::InternalError(
        fmt::format("cannot lock {}: {}", file.string(), std::strerror(error)));
  }
  return StateDirLock(fd);
}

bool StateDir::HasIdentity() const {
  std::error_code ec;
  return std::filesystem::exists(IdentityPath(), ec);
}

absl::Status StateDir::SaveIdentity(const Identity& identity) const {
  for (auto [path, data] : {std::pair{TrustBundlePath(), identity.trust_bundle.SerializeAsString()},
                            std::pair{JoinServiceKeyPath(), identity.join_service_key.SpkiDer()}}) {
    if (absl::Status s = AtomicWriteFile(path, data, 0600); !s.ok()) return s;
  }
  // Last: the identity file's presence is what marks a node as joined.
  return SaveRenewed(identity.key, identity.chain);
}

absl::Status StateDir::SaveRenewed(const pki::PrivateKey& key,
                                   const std::vector<pki::Certificate>& chain) const {
  std::string pem = key.ToPem();
  for (const pki::Certificate& cert : chain) pem += cert.Pem();
  return AtomicWriteFile(IdentityPath(), pem, 0600);
}

absl::StatusOr<Identity> StateDir::LoadIdentity() const {
  auto corrupt = [](const std::filesystem::path& path, const absl::Status& s) {
    return absl::DataLossError(fmt::format("{}: {}", path.string(), ToStd(s.message())));
  };
  absl::StatusOr<pki::PrivateKey> key = pki::LoadPrivateKey(IdentityPath());
  if (!key.ok()) return key.status();
  absl::StatusOr<std::string> pem = ReadWholeFile(IdentityPath(), 1 << 20);
  if (!pem.ok()) return pem.status();
  absl::StatusOr<std::vector<pki::Certificate>> chain = pki::ParsePemChain(*pem);
  if (!chain.ok()) return corrupt(IdentityPath(), chain.status());
  if (chain->front().SpkiDer() != key->Public().SpkiDer()) {
    return corrupt(IdentityPath(),
                   absl::DataLossError("the certificate is not for the key beside it"));
  }
  absl::StatusOr<pki::NodeIdentity> node = pki::IdentityOf(chain->front());
  if (!node.ok()) return corrupt(IdentityPath(), node.status());
  absl::StatusOr<std::string> join_spki = ReadWholeFile(JoinServiceKeyPath(), 4096);
  if (!join_spki.ok()) return join_spki.status();
  absl::StatusOr<pki::PublicKey> join_key = pki::PublicKey::FromSpkiDer(*join_spki);
  if (!join_key.ok()) return corrupt(JoinServiceKeyPath(), join_key.status());
  absl::StatusOr<std::string> bundle_bytes = ReadWholeFile(TrustBundlePath(), 1 << 20);
  if (!bundle_bytes.ok()) return bundle_bytes.status();
  bettercompute::agent::v1::SignedTrustBundle bundle;
  if (absl::Status s = proto::DecodeMessage(*bundle_bytes, &bundle); !s.ok())
    return corrupt(TrustBundlePath(), s);
  Identity identity{*std::move(key),      *std::move(chain), *std::move(node),
                    *std::move(join_key), std::move(bundle), std::nullopt};
  absl::StatusOr<std::string> source_bytes = ReadWholeFile(ApproverSourcePath(), 1 << 20);
  if (source_bytes.ok()) {
    bettercompute::agent::v1::SignedTrustBundle source;
    if (absl::Status s = proto::DecodeMessage(*source_bytes, &source); !s.ok())
      return corrupt(ApproverSourcePath(), s);
    identity.approver_source = std::move(source);
  } else if (!absl::IsNotFound(source_bytes.status())) {
    return source_bytes.status();
  }
  return identity;
}

absl::StatusOr<pki::TrustState> TrustOf(const Identity& identity) {
  return pki::TrustState::Restore(identity.trust_bundle,
                                  identity.approver_source ? &*identity.approver_source : nullptr,
                                  identity.join_service_key);
}

absl::Status StateDir::SaveTrust(const pki::TrustState& trust) const {
  if (trust.HoldsAnEarlierApproverSet()) {
    if (absl::Status s = AtomicWriteFile(ApproverSourcePath(),
                                         trust.approver_source().SerializeAsString(), 0600);
        !s.ok()) {
      return s;
    }
    return AtomicWriteFile(TrustBundlePath(), trust.signed_bundle().SerializeAsString(), 0600);
  }
  if (absl::Status s =
          AtomicWriteFile(TrustBundlePath(), trust.signed_bundle().SerializeAsString(), 0600);
      !s.ok()) {
    return s;
  }
  std::error_code ec;
  std::filesystem::remove(ApproverSourcePath(), ec);
  if (ec) {
    return absl::InternalError(
        fmt::format("cannot remove {}: {}", ApproverSourcePath().string(), ec.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<nlohmann::json> StateDirStatus(const std::filesystem::path& state_dir, int64_t now) {
  StateDir dir(state_dir);  // as it is: status creates and changes nothing
  nlohmann::json status = {{"version", Version()}, {"state_dir", state_dir.string()}};
  struct stat st {};
  if (stat(dir.IdentityPath().c_str(), &st) != 0) {
    if (errno == EACCES) {
      return absl::PermissionDeniedError(fmt::format(
          "cannot read the state dir {}: permission denied (run bcd status as root, or as the "
          "user bcd runs as)",
          state_dir.string()));
    }
    status["node"] = {{"joined", false},
                      {"error", fmt::format("not joined (no identity in {})", state_dir.string())}};
    return status;
  }
  absl::StatusOr<Identity> identity = dir.LoadIdentity();
  if (!identity.ok()) {
    if (absl::IsPermissionDenied(identity.status()) ||
        identity.status().message().find("Permission denied") != std::string::npos) {
      return absl::PermissionDeniedError(fmt::format("cannot read the identity in {}: {}",
                                                     state_dir.string(),
                                                     ToStd(identity.status().message())));
    }
    status["node"] = {{"joined", true}, {"error", ToStd(identity.status().message())}};
    return status;
  }
  status["node"] = {{"joined", true},
                    {"id", identity->node.id.ToString()},
                    {"generation", identity->node.generation.value_or(0)}};
  int64_t not_after = identity->chain.front().NotAfter();
  char when[32];
  time_t t = static_cast<time_t>(not_after);
  tm utc{};
  gmtime_r(&t, &utc);
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &utc);
  status["certificate"] = {{"not_after", not_after},
                           {"not_after_utc", when},
                           {"seconds_left", std::max<int64_t>(0, not_after - now)},
                           {"expired", not_after <= now}};
  absl::StatusOr<pki::TrustState> trust = TrustOf(*identity);
  if (trust.ok()) {
    status["trust"] = {{"version", trust->version()},
                       {"approver_set",
                        {{"epoch", trust->approvers().epoch()},
                         {"sha256", pki::Hex(trust->approvers().Sha256())}}}};
  } else {
    status["trust"] = {{"error", ToStd(trust.status().message())}};
  }
  return status;
}

std::string StatusText(const nlohmann::json& status) {
  // Fields read as they are documented; a missing one prints as "?" rather than failing (the text
  // is for people; scripts read --json).
  auto get = [](const nlohmann::json& object, const char* key) -> std::string {
    if (!object.is_object() || !object.contains(key)) return "?";
    const nlohmann::json& value = object.at(key);
    return value.is_string() ? value.get<std::string>() : value.dump();
  };
  const nlohmann::json& node = status.value("node", nlohmann::json::object());
  std::string text = fmt::format("version: {}\n", get(status, "version"));
  if (node.contains("error")) {
    text += fmt::format("node: {}\n", get(node, "error"));
  } else {
    text += fmt::format("node: {}\ngeneration: {}\n", get(node, "id"), get(node, "generation"));
    const nlohmann::json& cert = status.value("certificate", nlohmann::json::object());
    text += fmt::format("certificate expires: {} ({})\n", get(cert, "not_after_utc"),
                        cert.value("expired", false)
                            ? "EXPIRED"
                            : fmt::format("in {} s", get(cert, "seconds_left")));
    const nlohmann::json& trust = status.value("trust", nlohmann::json::object());
    if (trust.contains("error")) {
      text += fmt::format("trust: {}\n", get(trust, "error"));
    } else {
      const nlohmann::json& set = trust.value("approver_set", nlohmann::json::object());
      text += fmt::format("trust version: {}\napprover set: epoch {}, sha256 {}\n",
                          get(trust, "version"), get(set, "epoch"), get(set, "sha256"));
    }
  }
  const nlohmann::json& upgrade = status.value("upgrade", nlohmann::json::object());
  if (upgrade.is_object() && upgrade.contains("previous_binary") &&
      upgrade["previous_binary"].is_string()) {
    text += fmt::format("previous binary kept: {}\n", get(upgrade, "previous_binary"));
  }
  if (const nlohmann::json& last = upgrade.value("last", nlohmann::json()); last.is_object()) {
    std::string reason = last.value("reason", "");
    text += fmt::format("last upgrade: {} -> {} {}{}\n", get(last, "from"), get(last, "to"),
                        get(last, "outcome"), reason.empty() ? "" : " (" + reason + ")");
  }
  if (const nlohmann::json& now = upgrade.value("under_way", nlohmann::json()); now.is_object()) {
    text += fmt::format("upgrade under way: {} -> {} ({})\n", get(now, "from"), get(now, "to"),
                        get(now, "stage"));
  }
  const nlohmann::json& daemon = status.value("daemon", nlohmann::json::object());
  if (!daemon.value("running", false)) {
    return text +
           fmt::format("session: not running (no daemon answers on {})\n", get(daemon, "socket"));
  }
  const nlohmann::json& session = status.value("session", nlohmann::json::object());
  text += fmt::format("session: {} over {}", get(session, "state"), get(session, "transport"));
  if (!session.value("session_id", "").empty()) {
    text += fmt::format(" (session {}, protocol {}{})", get(session, "session_id"),
                        get(session, "protocol_version"),
                        session.value("upgrade_required", false) ? ", upgrade required" : "");
  }
  std::string error = session.value("last_error", "");
  text += fmt::format("\nlast error: {}\n", error.empty() ? "-" : error);
  return text;
}

}  // namespace bcd
