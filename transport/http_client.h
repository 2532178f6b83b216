#pragma once

// HTTP PUT of a file to a presigned URL (logs.collect). https verifies the server against the
// system's CA roots (SSL_CERT_FILE/SSL_CERT_DIR apply) and its host name, TLS 1.3 only; plain http
// is refused unless every address the host resolves to is a loopback address (the dev stack and
// tests), and then only those addresses are connected to. The body streams from the file with its
// Content-Length, never held whole in memory. Boost.Beast lives in this one translation unit.

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"

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

}  // namespace bcd
