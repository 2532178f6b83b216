#include "daemon/identity.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "fmt/format.h"
#include "pki/files.h"
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
  return std::filesystem::exists(KeyPath(), ec);
}

absl::Status StateDir::SaveIdentity(const Identity& identity) const {
  std::string chain;
  for (const pki::Certificate& cert : identity.chain) chain += cert.Pem();
  // The key last: its presence is what marks a node as joined.
  for (auto [path, data, mode] :
       {std::tuple{TrustBundlePath(), identity.trust_bundle.SerializeAsString(), 0600},
        std::tuple{JoinServiceKeyPath(), identity.join_service_key.SpkiDer(), 0600},
        std::tuple{ChainPath(), chain, 0644}}) {
    if (absl::Status s = pki::AtomicWriteFile(path, data, static_cast<mode_t>(mode)); !s.ok())
      return s;
  }
  return pki::StorePrivateKey(KeyPath(), identity.key);
}

absl::StatusOr<Identity> StateDir::LoadIdentity() const {
  auto corrupt = [](const std::filesystem::path& path, const absl::Status& s) {
    return absl::DataLossError(fmt::format("{}: {}", path.string(), ToStd(s.message())));
  };
  absl::StatusOr<pki::PrivateKey> key = pki::LoadPrivateKey(KeyPath());
  if (!key.ok()) return key.status();
  absl::StatusOr<std::string> chain_pem = pki::ReadWholeFile(ChainPath(), 1 << 20);
  if (!chain_pem.ok()) return chain_pem.status();
  absl::StatusOr<std::vector<pki::Certificate>> chain = pki::ParsePemChain(*chain_pem);
  if (!chain.ok()) return corrupt(ChainPath(), chain.status());
  absl::StatusOr<pki::NodeIdentity> node = pki::IdentityOf(chain->front());
  if (!node.ok()) return corrupt(ChainPath(), node.status());
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

}  // namespace bcd
