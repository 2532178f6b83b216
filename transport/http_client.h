#pragma once

// The HTTP client of the kinds that move files: a PUT of a file to a presigned URL (logs.collect)
// and a GET into a file (daemon.upgrade's release). https verifies the server against the
// system's CA roots (SSL_CERT_FILE/SSL_CERT_DIR apply) and its host name, TLS 1.3 only; plain http
// is refused unless every address the host resolves to is a loopback address (the dev stack and
// tests), and then only those addresses are connected to. The body streams from the file with its
// Content-Length, never held whole in memory; a GET streams to its file the same way. Boost.Beast
// lives in this one translation unit.

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "transport/proxy.h"

namespace bcd {

struct UploadRequest {
  std::string url;                             // https://... (with the presigned query)
  std::map<std::string, std::string> headers;  // from the payload (Content-Type, x-amz-...)
  std::filesystem::path file;
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};  // the whole exchange
  // When it turns true (cancel, timeout, shutdown) the exchange is abandoned within 100 ms.
  const std::atomic<bool>* stop = nullptr;
  // The addresses a host name resolves to (tests); the system's resolver when unset.
  std::function<std::vector<std::string>(const std::string& host)> resolve;
};

// The parts of a request checked before anything is resolved: the URL (https, or http) and the
// headers (no framing headers, no line breaks). InvalidArgument naming what is wrong.
absl::Status CheckUploadRequest(const UploadRequest& request);

// OK on a 2xx answer. InvalidArgument for a URL or header refused before connecting (plain http
// to a host with an address that is not loopback included); Unavailable for network, TLS and
// timeout failures; Cancelled when `stop` turned true; FailedPrecondition naming the status and
// the start of the body for any other answer.
absl::Status HttpPutFile(const UploadRequest& request);

// A GET of an https URL into a file: through the environment's proxy (https_proxy, no_proxy; an
// HTTP CONNECT tunnel), TLS 1.3 verified against the system's roots, up to 5 redirects (https
// only), the body streamed to `file` (created 0600, synced) and hashed while it streams.
struct DownloadRequest {
  std::string url;
  std::filesystem::path file;  // replaced if it exists
  uint64_t max_bytes = 0;      // more is refused, whatever Content-Length says
  // Called once the answer's headers are in, with its Content-Length when it sent one and before
  // a byte is written: an error stops the download with that error (room on the disk).
  std::function<absl::Status(std::optional<uint64_t> length)> on_length;
  std::chrono::milliseconds timeout{std::chrono::minutes(10)};  // the whole download
  const std::atomic<bool>* stop = nullptr;                      // as UploadRequest's
  std::function<std::vector<std::string>(const std::string& host)> resolve;
  transport::EnvLookup env = transport::ProcessEnv;  // where the proxy variables come from
  // Plain http too (and redirects to it), straight to the host without a proxy: for content the
  // caller checks by hash before it uses a byte (the boot server's kernels, on the site network).
  bool allow_http = false;
};
struct Downloaded {
  uint64_t bytes = 0;
  std::string sha256;  // 32 raw bytes, of what was written
};
// InvalidArgument for a URL that is not https (or http with allow_http), or a redirect to one;
// Unavailable for network, proxy, TLS and timeout failures; ResourceExhausted past max_bytes;
// FailedPrecondition naming an answer other than 200; Cancelled when `stop` turned true;
// on_length's error as it is; Internal when the file cannot be written. The file is removed on
// every error.
absl::StatusOr<Downloaded> HttpGetToFile(const DownloadRequest& request);

// How a device's certificate is trusted (a BMC's, self-signed as a rule): exactly one way.
struct DeviceTrust {
  std::string spki_sha256;  // 32 bytes: the leaf's public key must hash to this
  std::string ca_file;      // or: a chain to a CA of this PEM file, for the host or IP connected to
  bool unverified = false;  // or: no check at all (the site config names the device)
};

// One small HTTPS request to a device on the local network (a Redfish BMC): no proxy, TLS 1.3,
// one connection per exchange, the answer's body held in memory up to `max_body`.
struct DeviceRequest {
  std::string method;  // GET, POST, PATCH, DELETE
  std::string host;    // name or IP (IPv6 without brackets)
  uint16_t port = 443;
  std::string target;  // the path and query
  std::map<std::string, std::string> headers;
  std::string body;  // sent with Content-Length when not empty
  DeviceTrust trust;
  std::chrono::milliseconds timeout{std::chrono::seconds(20)};  // the whole exchange
  const std::atomic<bool>* stop = nullptr;                      // as UploadRequest's
  std::size_t max_body = 1 << 20;
};
struct DeviceAnswer {
  unsigned status = 0;
  std::map<std::string, std::string> headers;  // names in lower case
  std::string body;
};
// Connection failures are Unavailable and say which ("connection refused", "timed out", ...);
// a certificate the trust refuses is PermissionDenied naming what did not match (the pin, the CA);
// Cancelled when `stop` turned true; ResourceExhausted for a body over `max_body`. Any HTTP status
// is an answer.
absl::StatusOr<DeviceAnswer> HttpDeviceExchange(const DeviceRequest& request);

// A connection to one device for several exchanges: kept open while the device keeps it (HTTP/1.1
// keep-alive), so a BMC's TLS handshake is paid once per command rather than once per request.
// A kept connection the device closed while idle is replaced once, when it answered nothing.
// Exchange errors are HttpDeviceExchange's. Not thread-safe.
class DeviceConnection {
 public:
  DeviceConnection();
  ~DeviceConnection();
  DeviceConnection(const DeviceConnection&) = delete;
  DeviceConnection& operator=(const DeviceConnection&) = delete;
  absl::StatusOr<DeviceAnswer> Exchange(const DeviceRequest& request);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Whether a caller's request header may be sent: a token name, a value without line breaks or
// NUL, and none of the framing headers the client sets itself (Host, Content-Length,
// Transfer-Encoding, Connection).
bool SafeRequestHeader(std::string_view name, std::string_view value);

// One request into a site network for the control plane (site.httpProxy): http, or https verified
// against the system's roots and `ca_file` (TLS 1.3, the host name or IP checked). The caller
// resolved and checked the destination: only `addresses` are connected to (no second lookup a
// name could answer differently), no proxy, one connection, redirects returned as they are. The
// body is kept up to `max_body` bytes and the rest dropped (`truncated`).
struct SiteHttpRequest {
  std::string method;
  std::string host;  // for Host, SNI and the certificate check (IPv6 without brackets)
  uint16_t port = 80;
  bool tls = false;
  std::string target;                                        // the path and query
  std::vector<std::string> addresses;                        // IP literals to connect to, in order
  std::vector<std::pair<std::string, std::string>> headers;  // checked by the caller
  std::string body;     // sent with Content-Length when not empty
  std::string ca_file;  // more roots for https ("" = the system's only)
  std::size_t max_body = 1 << 20;
  std::chrono::milliseconds timeout{std::chrono::seconds(20)};
  const std::atomic<bool>* stop = nullptr;
};
struct SiteHttpAnswer {
  unsigned status = 0;
  std::vector<std::pair<std::string, std::string>> headers;  // as sent, in order
  std::string body;
  bool truncated = false;
};
// Unavailable for connection, TLS and timeout failures (saying which); PermissionDenied for a
// certificate that does not verify; Cancelled when `stop` turned true.
absl::StatusOr<SiteHttpAnswer> HttpSiteExchange(const SiteHttpRequest& request);

}  // namespace bcd
