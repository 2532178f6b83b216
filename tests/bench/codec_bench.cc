// Prints the cost of bounded decoding next to plain protobuf parsing of the same bytes, measured
// side by side in one run: median nanoseconds per decode over several rounds.
//
//   build/tests/bench/codec_bench [rounds]

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "bettercompute/agent/v1/session.pb.h"
#include "proto/frame_codec.h"

namespace {

namespace v1 = bettercompute::agent::v1;

double MedianNsPerOp(int rounds, int iterations, const std::function<void()>& op) {
  std::vector<double> samples;
  for (int r = 0; r < rounds; ++r) {
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < iterations; ++i) op();
    std::chrono::duration<double, std::nano> elapsed = std::chrono::steady_clock::now() - start;
    samples.push_back(elapsed.count() / iterations);
  }
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

std::string CommandFrame() {
  v1::Command command;
  command.set_command_id("c-0123456789");
  command.set_node_id("node-42");
  command.set_kind("inventory.refresh");
  command.set_issued_at(1700000000);
  command.set_expires_at(1700000300);
  v1::ServerFrame frame;
  frame.mutable_command()->set_body(command.SerializeAsString());
  frame.mutable_command()->mutable_signature()->set_sig(std::string(64, 's'));
  frame.mutable_command()->mutable_signature()->set_kid("worker-1");
  frame.mutable_command()->mutable_signature()->add_chain(std::string(600, 'c'));
  return frame.SerializeAsString();
}

std::string HelloFrame() {
  v1::AgentFrame frame;
  v1::Hello* hello = frame.mutable_hello();
  hello->set_proto_min(1);
  hello->set_proto_max(1);
  hello->set_daemon_version("0.1.0");
  for (const char* cap : {"tunnel.shell", "tunnel.exec", "tunnel.tcp", "secrets.jwe"}) {
    hello->add_capabilities(cap);
  }
  hello->set_approver_set_sha256(std::string(32, 'h'));
  return frame.SerializeAsString();
}

template <typename T>
void Compare(const char* name, const std::string& bytes, int rounds) {
  constexpr int kIterations = 20000;
  double plain = MedianNsPerOp(rounds, kIterations, [&] {
    T message;
    if (!message.ParseFromString(bytes)) std::abort();
  });
  double bounded = MedianNsPerOp(rounds, kIterations, [&] {
    T message;
    if (!bcd::proto::DecodeMessage(bytes, &message).ok()) std::abort();
  });
  std::printf("%-24s %5zu bytes  protobuf %7.0f ns  bcd::DecodeMessage %7.0f ns  ratio %.2f\n",
              name, bytes.size(), plain, bounded, bounded / plain);
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = argc > 1 ? std::atoi(argv[1]) : 15;
  std::printf("median of %d rounds\n", rounds);
  Compare<v1::ServerFrame>("ServerFrame(command)", CommandFrame(), rounds);
  Compare<v1::AgentFrame>("AgentFrame(hello)", HelloFrame(), rounds);
  return 0;
}
