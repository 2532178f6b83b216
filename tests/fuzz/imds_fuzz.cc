// Arbitrary bytes as one HTTP request to the instance metadata service, from an instance's address
// and from an unknown one.

#include <cstdint>
#include <sstream>
#include <string_view>

#include "modes/node/imds.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static std::ostringstream sink;
  static bcd::Logger log(&sink, bcd::LogLevel::kError);
  static bcd::ImdsServer* server = [] {
    bettercompute::agent::v1::VpsInstance instance;
    instance.set_instance_id("vm-a");
    instance.set_address("127.0.0.2");
    instance.set_user_data_ref("secret://vm-a");
    return bcd::ImdsServer::Start(
               {.host = "127.0.0.1",
                .port = 0,
                .instances = [instance] { return std::vector{instance}; },
                .user_data = [](const auto&) -> absl::StatusOr<std::string> { return "data"; },
                .token = [](const auto&, const std::string& audience)
                    -> absl::StatusOr<std::string> { return "jwt-" + audience; },
                .now = [] { return int64_t{1000}; }},
               &log)
        ->release();
  }();
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  (void)server->AnswerBytes(bytes, "127.0.0.2");
  (void)server->AnswerBytes(bytes, "127.0.0.9");
  return 0;
}
