#include "daemon/identity.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <ctime>

#include "fmt/format.h"
#include "pki/files.h"
#include "pki/trust.h"
#include "proto/absl_compat.h"
#include "proto/frame_codec.h"

namespace bcd {

absl::StatusOr<StateDir> StateDir::Open(const std::filesystem::path& path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec)
    return absl::InternalError(
        fmt::format("cannot create the state dir {}: {}", path.string(), ec.message()));
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) {
    return absl::InternalError(
        fmt::format("cannot read the state dir {}: {}", path.string(), std::strerror(errno)));
  }
  if ((st.st_mode & 077) != 0) {
    // A directory this code just made (mode from umask) is tightened; any other is refused.
    if (chmod(path.c_str(), 0700) != 0) {
      return absl::PermissionDeniedError(fmt::format(
          "state dir {} has mode {:04o}; it must be 0700", path.string(), st.st_mode & 07777));
    }
  }
  return StateDir(path);
}

bool StateDir::HasIdentity() const {
  std::error_code ec;
  return std::filesystem::exists(IdentityPath(), ec);
}

absl::Status StateDir::SaveIdentity(const Identity& identity) const {
  for (auto [path, data] : {std::pair{TrustBundlePath(), identity.trust_bundle.SerializeAsString()},
                            std::pair{JoinServiceKeyPath(), identity.join_service_key.SpkiDer()}}) {
    if (absl::Status s = pki::AtomicWriteFile(path, data, 0600); !s.ok()) return s;
  }
  // Last: the identity file's presence is what marks a node as joined.
  return SaveRenewed(identity.key, identity.chain);
}

absl::Status StateDir::SaveRenewed(const pki::PrivateKey& key,
                                   const std::vector<pki::Certificate>& chain) const {
  std::string pem = key.ToPem();
  for (const pki::Certificate& cert : chain) pem += cert.Pem();
  return pki::AtomicWriteFile(IdentityPath(), pem, 0600);
}

absl::StatusOr<Identity> StateDir::LoadIdentity() const {
  auto corrupt = [](const std::filesystem::path& path, const absl::Status& s) {
    return absl::DataLossError(fmt::format("{}: {}", path.string(), ToStd(s.message())));
  };
  absl::StatusOr<pki::PrivateKey> key = pki::LoadPrivateKey(IdentityPath());
  if (!key.ok()) return key.status();
  absl::StatusOr<std::string> pem = pki::ReadWholeFile(IdentityPath(), 1 << 20);
  if (!pem.ok()) return pem.status();
  absl::StatusOr<std::vector<pki::Certificate>> chain = pki::ParsePemChain(*pem);
  if (!chain.ok()) return corrupt(IdentityPath(), chain.status());
  if (chain->front().SpkiDer() != key->Public().SpkiDer()) {
    return corrupt(IdentityPath(),
                   absl::DataLossError("the certificate is not for the key beside it"));
  }
  absl::StatusOr<pki::NodeIdentity> node = pki::IdentityOf(chain->front());
  if (!node.ok()) return corrupt(IdentityPath(), node.status());
  absl::StatusOr<std::string> join_spki = pki::ReadWholeFile(JoinServiceKeyPath(), 4096);
  if (!join_spki.ok()) return join_spki.status();
  absl::StatusOr<pki::PublicKey> join_key = pki::PublicKey::FromSpkiDer(*join_spki);
  if (!join_key.ok()) return corrupt(JoinServiceKeyPath(), join_key.status());
  absl::StatusOr<std::string> bundle_bytes = pki::ReadWholeFile(TrustBundlePath(), 1 << 20);
  if (!bundle_bytes.ok()) return bundle_bytes.status();
  bettercompute::agent::v1::SignedTrustBundle bundle;
  if (absl::Status s = proto::DecodeMessage(*bundle_bytes, &bundle); !s.ok())
    return corrupt(TrustBundlePath(), s);
  return Identity{*std::move(key), *std::move(chain), *std::move(node), *std::move(join_key),
                  std::move(bundle)};
}

std::string StateDirStatusText(const std::filesystem::path& state_dir, int64_t now) {
  absl::StatusOr<StateDir> dir = StateDir::Open(state_dir);
  if (!dir.ok()) return fmt::format("state: {}\n", ToStd(dir.status().message()));
  if (!dir->HasIdentity())
    return fmt::format("node: not joined (no identity in {})\n", state_dir.string());
  absl::StatusOr<Identity> identity = dir->LoadIdentity();
  if (!identity.ok()) return fmt::format("node: {}\n", ToStd(identity.status().message()));
  int64_t not_after = identity->chain.front().NotAfter();
  char when[32];
  time_t t = static_cast<time_t>(not_after);
  tm utc{};
  gmtime_r(&t, &utc);
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &utc);
  std::string text =
      fmt::format("node: {}\ngeneration: {}\ncertificate expires: {} ({})\n",
                  identity->node.id.ToString(), identity->node.generation.value_or(0), when,
                  not_after > now ? fmt::format("in {} s", not_after - now) : "EXPIRED");
  absl::StatusOr<pki::TrustState> trust =
      pki::TrustState::FromFirstBundle(identity->trust_bundle, identity->join_service_key);
  if (trust.ok()) {
    text += fmt::format("trust version: {}\napprover set: epoch {}, sha256 {}\n", trust->version(),
                        trust->approvers().epoch(), pki::Hex(trust->approvers().Sha256()));
  } else {
    text += fmt::format("trust: {}\n", ToStd(trust.status().message()));
  }
  return text;
}

}  // namespace bcd
