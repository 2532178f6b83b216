#include "testing/dev_control.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "fmt/format.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/dynamic_message.h"
#include "google/protobuf/util/json_util.h"
#include "nlohmann/json.hpp"
#include "proto/absl_compat.h"
#include "proto/kinds.h"
#include "testing/child_process.h"

namespace bcd::testing {

namespace v1 = bettercompute::agent::v1;
using json = nlohmann::json;

namespace {

std::unique_ptr<google::protobuf::Message> NewMessage(std::string_view type) {
  const google::protobuf::Descriptor* descriptor =
      google::protobuf::DescriptorPool::generated_pool()->FindMessageTypeByName(std::string(type));
  if (descriptor == nullptr) return nullptr;
  return std::unique_ptr<google::protobuf::Message>(
      google::protobuf::MessageFactory::generated_factory()->GetPrototype(descriptor)->New());
}

// The address of a unix socket; InvalidArgument when the path is too long for one.
absl::StatusOr<sockaddr_un> UnixAddress(const std::filesystem::path& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.string().size() >= sizeof addr.sun_path)
    return absl::InvalidArgumentError(path.string() + ": too long for a unix socket path");
  std::strcpy(addr.sun_path, path.c_str());
  return addr;
}

}  // namespace

std::string ProtoJson(const google::protobuf::Message& message) {
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(message, &out, options);
  return out;
}

DevControlPlane::DevControlPlane(const DevPki* pki, DevGateway* gateway)
    : pki_(pki), gateway_(gateway) {
  for (int i = 0; i < 3; ++i) approvers_.push_back(*pki::PrivateKey::Generate());
}

DevControlPlane::~DevControlPlane() {
  stopping_ = true;
  if (thread_.joinable()) thread_.join();
  std::vector<std::thread> tunnels;
  {
    std::lock_guard<std::mutex> lock(tunnels_mu_);
    tunnels.swap(tunnel_threads_);
  }
  for (std::thread& t : tunnels) t.join();
  if (listen_fd_ >= 0) close(listen_fd_);
}

v1::SignedTrustBundle DevControlPlane::ApproverBundle() const {
  return pki_->SignedBundleWithApprovers(2, approvers_, 2, 1, 10);
}

absl::StatusOr<std::string> DevControlPlane::Run(const std::string& node, const std::string& kind,
                                                 const std::string& payload_json,
                                                 std::chrono::milliseconds timeout) {
  const proto::KindSpec* spec = proto::FindKind(kind);
  if (spec == nullptr) return absl::InvalidArgumentError(fmt::format("unknown kind \"{}\"", kind));
  std::unique_ptr<google::protobuf::Message> payload = NewMessage(spec->payload_type);
  if (auto s = google::protobuf::util::JsonStringToMessage(
          payload_json.empty() ? "{}" : payload_json, payload.get());
      !s.ok()) {
    return absl::InvalidArgumentError(
        fmt::format("payload for {} ({}): {}", kind, spec->payload_type, std::string(s.message())));
  }
  v1::Command command;
  {
    std::lock_guard<std::mutex> lock(mu_);
    command.set_command_id(fmt::format("dev-{}-{}", std::time(nullptr), next_command_++));
  }
  command.set_node_id(node);
  command.set_kind(kind);
  // Every dev command is one step of one workflow: secrets for dev commands are bound to it.
  command.set_workflow_id("dev");
  command.set_step_id("dev");
  command.set_payload(payload->SerializeAsString());
  auto now = static_cast<uint64_t>(std::time(nullptr));
  command.set_issued_at(now);
  command.set_expires_at(now + 600);
  v1::SignedCommand signed_command = pki_->SignCommand(command);
  if (spec->Has(proto::kQuorum)) DevPki::Approve(&signed_command, approvers_, {0, 1});
  v1::ServerFrame frame;
  *frame.mutable_command() = signed_command;
  if (!gateway_->Push(node, frame)) {
    return absl::UnavailableError(fmt::format("node {} has no open session", node));
  }
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    json updates = json::array();
    std::optional<v1::CommandUpdate> last;
    for (const v1::AgentFrame& received : gateway_->Received(node)) {
      if (!received.has_command_update() ||
          received.command_update().command_id() != command.command_id()) {
        continue;
      }
      v1::CommandUpdate update = received.command_update();
      update.clear_result();  // shown decoded below
      updates.push_back(json::parse(ProtoJson(update)));
      last = received.command_update();
    }
    if (last && proto::IsTerminal(last->state())) {
      json answer = {{"command_id", command.command_id()},
                     {"state", v1::CommandState_Name(last->state())},
                     {"updates", updates}};
      if (last->code() != v1::COMMAND_CODE_UNSPECIFIED)
        answer["code"] = v1::CommandCode_Name(last->code());
      if (!last->message().empty()) answer["message"] = last->message();
      if (std::unique_ptr<google::protobuf::Message> result = NewMessage(spec->result_type);
          result && !last->result().empty() && result->ParseFromString(last->result())) {
        answer["result"] = json::parse(ProtoJson(*result));
      }
      return answer.dump(2);
    }
    gateway_->WaitForReceived(node, gateway_->Received(node).size() + 1,
                              std::chrono::milliseconds(100));
  }
  return absl::DeadlineExceededError(fmt::format("no result for {} ({}) within {} ms",
                                                 command.command_id(), kind, timeout.count()));
}

absl::StatusOr<std::string> DevControlPlane::ApplySpec(const std::string& node,
                                                       const std::string& spec_json,
                                                       std::chrono::milliseconds timeout) {
  v1::NodeSpec spec;
  if (auto s = google::protobuf::util::JsonStringToMessage(spec_json, &spec); !s.ok()) {
    return absl::InvalidArgumentError(fmt::format("spec: {}", std::string(s.message())));
  }
  if (spec.node_id().empty()) spec.set_node_id(node);
  // The dev control plane's tunnel keys ride along unless the spec sets its own.
  if (!spec.has_access()) *spec.mutable_access() = gateway_->TunnelAccess();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (spec.generation() == 0) spec.set_generation(next_generation_);
    next_generation_ = std::max(next_generation_, spec.generation()) + 1;
  }
  std::size_t before = 0;
  for (const v1::AgentFrame& frame : gateway_->Received(node)) before += frame.has_spec_ack();
  v1::ServerFrame frame;
  *frame.mutable_desired_state() = pki_->SignSpec(spec);
  if (!gateway_->Push(node, frame)) {
    return absl::UnavailableError(fmt::format("node {} has no open session", node));
  }
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    std::size_t seen = 0;
    for (const v1::AgentFrame& received : gateway_->Received(node)) {
      if (received.has_spec_ack() && ++seen > before) return ProtoJson(received.spec_ack());
    }
    gateway_->WaitForReceived(node, gateway_->Received(node).size() + 1,
                              std::chrono::milliseconds(100));
  }
  return absl::DeadlineExceededError("no SpecAck came");
}

std::string DevControlPlane::Handle(const std::string& text, const std::string& node) {
  json request = json::parse(text, nullptr, /*allow_exceptions=*/false);
  absl::StatusOr<std::string> answer = absl::InvalidArgumentError("not a JSON request");
  if (request.is_object() && request.value("op", "") == "run" && request["kind"].is_string()) {
    std::string payload = request.contains("payload") ? request["payload"].dump() : "{}";
    answer = Run(node, request["kind"].get<std::string>(), payload, std::chrono::minutes(15));
  } else if (request.is_object() && request.value("op", "") == "spec" && request.contains("spec")) {
    answer = ApplySpec(node, request["spec"].dump(), std::chrono::seconds(30));
  }
  if (request.is_object() && request.value("op", "") == "token" && request["node"].is_string()) {
    // A one-time join token for another node (bcd-dev install-script).
    std::string id = request["node"];
    bool valid = !id.empty() && id.size() <= 63 && std::all_of(id.begin(), id.end(), [](char c) {
      return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-';
    });
    if (!valid) {
      return json{{"ok", false}, {"error", "a node id is 1 to 63 of a-z, 0-9 and -"}}.dump();
    }
    answer = json{{"node", id}, {"token", gateway_->AddJoinToken(id)}}.dump();
  }
  if (request.is_object() && request.value("op", "") == "secret" && request["ref"].is_string() &&
      request["value"].is_string()) {
    DevGateway::SecretBinding binding{request.value("workflow_id", ""),
                                      request.value("step_id", ""),
                                      request.value("allocation_id", "")};
    bool step = !binding.workflow_id.empty() && !binding.step_id.empty();
    if (!step && binding.allocation_id.empty()) {
      return json{{"ok", false}, {"error", "a secret is bound to a workflow step or an allocation"}}
          .dump();
    }
    gateway_->AddSecret(request["ref"], request["value"], binding);
    answer = json{{"ref", request["ref"]}, {"bound", true}}.dump();
  }
  if (!answer.ok()) return json{{"ok", false}, {"error", ToStd(answer.status().message())}}.dump();
  return json{{"ok", true}, {"answer", json::parse(*answer)}}.dump(2);
}

absl::Status DevControlPlane::Serve(const std::filesystem::path& socket_path,
                                    const std::string& node) {
  absl::StatusOr<sockaddr_un> addr = UnixAddress(socket_path);
  if (!addr.ok()) return addr.status();
  std::filesystem::remove(socket_path);
  listen_fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  mode_t old = umask(0177);
  int rc = bind(listen_fd_, reinterpret_cast<sockaddr*>(&*addr), sizeof *addr);
  umask(old);
  if (rc != 0 || listen(listen_fd_, 4) != 0) {
    return absl::InternalError(fmt::format("{}: {}", socket_path.string(), std::strerror(errno)));
  }
  thread_ = std::thread([this, node] { Loop(node); });
  return absl::OkStatus();
}

void DevControlPlane::Loop(std::string node) {
  while (!stopping_) {
    pollfd pfd{listen_fd_, POLLIN, 0};
    if (poll(&pfd, 1, 100) <= 0) continue;
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    char first = 0;
    if (recv(fd, &first, 1, MSG_PEEK) == 1 && first == 'o') {
      std::lock_guard<std::mutex> lock(tunnels_mu_);
      tunnel_threads_.emplace_back([this, fd, node] { ServeTunnel(fd, node); });
      continue;
    }
    std::string request = ReadToEnd(fd, 1 << 20);
    std::string answer;
    try {
      answer = Handle(request, node);
    } catch (const std::exception& e) {
      // A member of the wrong type, say: the request is refused, the stack keeps serving.
      answer =
          json{{"ok", false}, {"error", fmt::format("a malformed request: {}", e.what())}}.dump();
    }
    SendAll(fd, answer + "\n");
    close(fd);
  }
}

void DevControlPlane::ServeTunnel(int fd, const std::string& node) {
  char type = 0;
  std::string payload;
  nlohmann::json request;
  if (!ReadTunnelMessage(fd, &type, &payload) || type != 'o' ||
      !(request = nlohmann::json::parse(payload, nullptr, false)).is_object()) {
    close(fd);
    return;
  }
  DevTunnelRequest ask;
  try {
    ask.op = request.value("op", "exec");
    if (request.contains("cmd") && request["cmd"].is_array()) {
      for (const auto& arg : request["cmd"]) {
        if (arg.is_string()) ask.cmd.push_back(arg.get<std::string>());
      }
    }
    ask.host = request.value("host", "");
    ask.port = request.value("port", uint16_t{0});
    ask.rows = request.value("rows", uint16_t{0});
    ask.cols = request.value("cols", uint16_t{0});
  } catch (const std::exception& e) {
    WriteTunnelMessage(fd, 'F', fmt::format("a malformed tunnel request: {}", e.what()));
    close(fd);
    return;
  }
  DevTunnel tunnel = gateway_->OpenTunnel(node, ask);
  if (!tunnel.WaitOpened(std::chrono::seconds(10))) {
    WriteTunnelMessage(fd, 'F',
                       "the node did not open the tunnel within 10 s (its tunnel.refused event "
                       "says why)");
    close(fd);
    return;
  }
  WriteTunnelMessage(fd, 'O', tunnel.id());
  std::thread from_operator([&tunnel, fd] {
    char type = 0;
    std::string payload;
    while (ReadTunnelMessage(fd, &type, &payload)) {
      if (type == 'd') {
        tunnel.Send(0, payload);
      } else if (type == 'e') {
        tunnel.Send(0, "");
      } else if (type == 'r') {
        unsigned rows = 0, cols = 0;
        if (std::sscanf(payload.c_str(), "%u %u", &rows, &cols) == 2) tunnel.Resize(rows, cols);
      } else if (type == 'x') {
        break;
      }
    }
    tunnel.Close();  // the operator went away or asked to close
  });
  nlohmann::json closed = {{"exit_code", -1}, {"reason", "the tunnel stream ended"}};
  while (!stopping_) {
    std::optional<bettercompute::agent::v1::TunnelFrame> frame =
        tunnel.Next(std::chrono::milliseconds(200));
    if (!frame) {
      if (tunnel.WaitEnded(std::chrono::milliseconds(0))) break;
      continue;
    }
    if (frame->has_data()) {
      if (!WriteTunnelMessage(fd, frame->data().channel() == 1 ? 'E' : 'D', frame->data().data()))
        break;
    } else if (frame->has_closed()) {
      closed = {{"exit_code", frame->closed().exit_code()}, {"reason", frame->closed().reason()}};
      break;
    }
  }
  WriteTunnelMessage(fd, 'C', closed.dump());
  shutdown(fd, SHUT_RDWR);
  from_operator.join();
  tunnel.Cancel();
  close(fd);
}

absl::StatusOr<int> ConnectDevControl(const std::filesystem::path& socket_path) {
  absl::StatusOr<sockaddr_un> addr = UnixAddress(socket_path);
  if (!addr.ok()) return addr.status();
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (connect(fd, reinterpret_cast<sockaddr*>(&*addr), sizeof *addr) != 0) {
    close(fd);
    return absl::UnavailableError(
        fmt::format("{}: {} (is bcd-dev up running?)", socket_path.string(), std::strerror(errno)));
  }
  return fd;
}

bool WriteTunnelMessage(int fd, char type, std::string_view payload) {
  std::string message(5, '\0');
  message[0] = type;
  uint32_t length = static_cast<uint32_t>(payload.size());
  for (int i = 0; i < 4; ++i) message[1 + i] = static_cast<char>(length >> (24 - 8 * i));
  message.append(payload);
  return SendAll(fd, message);
}

bool ReadTunnelMessage(int fd, char* type, std::string* payload) {
  auto read_exactly = [fd](char* out, std::size_t size) {
    while (size > 0) {
      ssize_t n = read(fd, out, size);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      out += n;
      size -= static_cast<std::size_t>(n);
    }
    return true;
  };
  unsigned char header[5];
  if (!read_exactly(reinterpret_cast<char*>(header), 5)) return false;
  uint32_t length = (uint32_t{header[1]} << 24) | (uint32_t{header[2]} << 16) |
                    (uint32_t{header[3]} << 8) | header[4];
  if (length > (1u << 20)) return false;
  *type = static_cast<char>(header[0]);
  payload->resize(length);
  return read_exactly(payload->data(), length);
}

absl::StatusOr<std::string> AskDevControl(const std::filesystem::path& socket_path,
                                          const std::string& request) {
  absl::StatusOr<int> fd = ConnectDevControl(socket_path);
  if (!fd.ok()) return fd.status();
  return Converse(*fd, request);
}

}  // namespace bcd::testing
