#pragma once

// HTTP PUT of a file to a presigned URL (logs.collect). https verifies the server against the
// system's CA roots (SSL_CERT_FILE/SSL_CERT_DIR apply) and its host name, TLS 1.3 only; plain http
// is refused except to a loopback address (the dev stack and tests). The body streams from the
// file with its Content-Length, never held whole in memory. Boost.Beast lives in this one
// translation unit.

#include <chrono>
#include <filesystem>
#include <map>
#include <string>

#include "absl/status/status.h"

namespace bcd {

struct UploadRequest {
  std::string url;                             // https://... (with the presigned query)
  std::map<std::string, std::string> headers;  // from the payload (Content-Type, x-amz-...)
  std::filesystem::path file;
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};  // the whole exchange
};

// OK on a 2xx answer. InvalidArgument for a URL or header refused before connecting; Unavailable
// for network, TLS and timeout failures; FailedPrecondition naming the status and the start of the
// body for any other answer.
absl::Status HttpPutFile(const UploadRequest& request);

}  // namespace bcd
