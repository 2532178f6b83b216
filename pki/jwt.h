#pragma once

// Tunnel tickets: compact ES256 JWS verified against the JWKS of the node spec's access section,
// and the jti set that makes each ticket single-use across restarts. Any alg but ES256 (none,
// HS256, RS256 ...) is refused.

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "pki/keys.h"

namespace bcd::pki {

inline constexpr int64_t kTicketMaxLifetime = 60;  // exp - iat, seconds
// The tolerated difference between the gateway's clock and this node's, seconds: a ticket is taken
// from iat - 10 s to exp + 10 s of this node's clock (70 s after iat at the most).
inline constexpr int64_t kTicketClockSkew = 10;
inline constexpr std::size_t kMaxTicketBytes = 16 * 1024;

struct TicketExpectation {
  std::string_view node_id;     // aud must be node:<node_id>
  std::string_view session_id;  // sid
  std::string_view tunnel_id;   // tid
  int64_t now;                  // unix seconds
};

class TunnelTicket {
 public:
  // The ticket's claims, once its signature, audience, lifetime, session, tunnel id and op check
  // out. Does not consult the jti set: JtiSet::Use does.
  static absl::StatusOr<TunnelTicket> Verify(std::string_view compact, std::string_view jwks_json,
                                             const TicketExpectation& expect);

  const std::string& jti() const { return jti_; }
  int64_t exp() const { return exp_; }
  const std::string& op() const { return op_; }                 // shell, exec, tcp, instance-tcp
  const std::vector<std::string>& cmd() const { return cmd_; }  // exec
  const std::string& host() const { return host_; }             // tcp
  const std::string& instance() const { return instance_; }     // instance-tcp
  uint16_t port() const { return port_; }                       // tcp, instance-tcp
  uint16_t rows() const { return rows_; }                       // shell, 0 when absent
  uint16_t cols() const { return cols_; }                       // shell, 0 when absent

 private:
  TunnelTicket() = default;
  std::string jti_, op_, host_, instance_;
  std::vector<std::string> cmd_;
  int64_t exp_ = 0;
  uint16_t port_ = 0, rows_ = 0, cols_ = 0;
};

// The jti of every ticket used and not yet expired, persisted so a restart cannot replay one.
// A jti is forgotten only once its ticket is past exp + skew, and the set then keeps a floor: the
// latest exp it forgot. A ticket whose exp is not above the floor is refused outright, so a
// forgotten jti can never be used again, whatever the clock does later (a step back included).
// Not thread-safe.
class JtiSet {
 public:
  static constexpr std::size_t kMaxEntries = 100000;
  // Reads `path` (missing means empty); a corrupt file is an error naming it, never emptied.
  static absl::StatusOr<JtiSet> Load(const std::filesystem::path& path);

  // Records the ticket's jti, or AlreadyExists when it was used before. Persists before returning
  // OK, so a crash never forgets a used jti.
  absl::Status Use(const TunnelTicket& ticket, int64_t now);
  absl::Status Use(std::string_view jti, int64_t exp, int64_t now);
  std::size_t size() const { return entries_.size(); }
  int64_t floor() const { return floor_; }

 private:
  explicit JtiSet(std::filesystem::path path) : path_(std::move(path)) {}
  std::filesystem::path path_;
  std::map<std::string, int64_t, std::less<>> entries_;  // jti -> exp
  int64_t floor_ = 0;                                    // the latest exp forgotten
};

// Signs `claims_json` as a compact ES256 JWS with header {"alg":"ES256","kid":kid,"typ":"JWT"}.
// For the dev gateway and tests.
absl::StatusOr<std::string> SignJwt(std::string_view claims_json, const PrivateKey& key,
                                    std::string_view kid);
// The number of keys in a JWKS when every one is a usable EC P-256 key with a kid; otherwise
// InvalidArgument naming the first that is not.
absl::StatusOr<std::size_t> CheckJwks(std::string_view jwks_json);

// A JWKS with one public key.
std::string JwksOf(const PublicKey& key, std::string_view kid);

}  // namespace bcd::pki
