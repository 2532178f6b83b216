// The instance metadata service on loopback: two instances at 127.0.0.2 and 127.0.0.3 (loopback
// aliases: a client socket bound to each), real HTTP over real sockets.

#include "modes/node/imds.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <future>
#include <sstream>
#include <thread>

#include "gtest/gtest.h"
#include "testing/child_process.h"
#include "testing/wait.h"

namespace bcd {
namespace {

namespace v1 = bettercompute::agent::v1;

struct Reply {
  int status = 0;
  std::string body;
};

// One HTTP/1.1 request from `source` to 127.0.0.1:port.
Reply Ask(const std::string& source, uint16_t port, const std::string& method,
          const std::string& target, const std::vector<std::string>& headers = {}) {
  std::string request = method + " " + target + " HTTP/1.1\r\nHost: 169.254.169.254\r\n";
  for (const std::string& header : headers) request += header + "\r\n";
  std::string answer = bcd::testing::SendFrom(source, port, request + "\r\n");
  Reply reply;
  if (answer.size() > 12) reply.status = std::stoi(answer.substr(9, 3));
  if (std::size_t at = answer.find("\r\n\r\n"); at != std::string::npos)
    reply.body = answer.substr(at + 4);
  return reply;
}

// A TCP connection from `source` to 127.0.0.1:port that sends nothing (-1 when it cannot connect).
int ConnectFrom(const std::string& source, uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in local{}, remote{};
  local.sin_family = remote.sin_family = AF_INET;
  inet_pton(AF_INET, source.c_str(), &local.sin_addr);
  inet_pton(AF_INET, "127.0.0.1", &remote.sin_addr);
  remote.sin_port = htons(port);
  if (bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof local) != 0 ||
      connect(fd, reinterpret_cast<sockaddr*>(&remote), sizeof remote) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Whether the server closed `fd` within 20 s (EOF or a reset).
bool ClosedByServer(int fd) {
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, 20000) != 1) return false;
  char c;
  return read(fd, &c, 1) <= 0;
}

class Imds : public ::testing::Test {
 protected:
  Imds() { Start(std::chrono::seconds(5)); }
  void Start(std::chrono::milliseconds deadline) {
    server_.reset();
    v1::VpsInstance a, b;
    a.set_instance_id("vm-a");
    a.set_allocation_id("alloc-a");
    a.set_address("127.0.0.2");
    a.set_user_data_ref("secret://vm-a/cloud-init");
    b.set_instance_id("vm-b");
    b.set_address("127.0.0.3");
    instances_ = {a, b};
    server_ = *ImdsServer::Start(
        {.host = "127.0.0.1",
         .port = 0,
         .instances = [this] { return instances_; },
         .user_data = [this](const v1::VpsInstance& i) -> absl::StatusOr<std::string> {
           ++fetches_;
           // Like a secret fetch waiting on the session, until the test lets it go.
           testing::WaitFor([this] { return !hold_user_data_; }, std::chrono::seconds(10));
           return "#cloud-config for " + i.instance_id() + " (" + i.allocation_id() + ")";
         },
         .token = [](const v1::VpsInstance& i,
                     const std::string& audience) -> absl::StatusOr<std::string> {
           if (audience == "refused") return absl::PermissionDeniedError("not-bound");
           return "jwt-for-" + i.instance_id() + "-" + audience;
         },
         .now = [this] { return now_; },
         .request_deadline = deadline},
        &log_);
  }
  std::string TokenFor(const std::string& source, int ttl = 60) {
    Reply reply = Ask(source, server_->port(), "PUT", "/v1/api/token",
                      {"X-BC-Metadata-Token-TTL-Seconds: " + std::to_string(ttl)});
    EXPECT_EQ(reply.status, 200) << reply.body;
    return reply.body;
  }

  std::vector<v1::VpsInstance> instances_;
  int64_t now_ = 1000;
  std::atomic<int> fetches_{0};
  std::atomic<bool> hold_user_data_{false};
  std::ostringstream log_text_;
  Logger log_{&log_text_, LogLevel::kInfo};
  std::unique_ptr<ImdsServer> server_;
};

TEST_F(Imds, EachInstanceGetsItsOwnMetadataWithAToken) {
  std::string a = TokenFor("127.0.0.2");
  Reply meta =
      Ask("127.0.0.2", server_->port(), "GET", "/v1/meta-data", {"X-BC-Metadata-Token: " + a});
  EXPECT_EQ(meta.status, 200);
  EXPECT_EQ(meta.body, R"({"addresses":["127.0.0.2"],"hostname":"vm-a","instance_id":"vm-a"})");
  std::string b = TokenFor("127.0.0.3");
  Reply other =
      Ask("127.0.0.3", server_->port(), "GET", "/v1/meta-data", {"X-BC-Metadata-Token: " + b});
  EXPECT_NE(other.body.find("\"vm-b\""), std::string::npos);
  Reply user =
      Ask("127.0.0.2", server_->port(), "GET", "/v1/user-data", {"X-BC-Metadata-Token: " + a});
  EXPECT_EQ(user.body, "#cloud-config for vm-a (alloc-a)");
  EXPECT_EQ(Ask("127.0.0.3", server_->port(), "GET", "/v1/user-data", {"X-BC-Metadata-Token: " + b})
                .status,
            404)
      << "vm-b has no user data";
  Reply jwt = Ask("127.0.0.2", server_->port(), "GET", "/v1/token?audience=sts.example",
                  {"X-BC-Metadata-Token: " + a});
  EXPECT_EQ(jwt.body, "jwt-for-vm-a-sts.example");
  EXPECT_EQ(Ask("127.0.0.2", server_->port(), "GET", "/v1/token?audience=refused",
                {"X-BC-Metadata-Token: " + a})
                .status,
            502);
  // Nothing is cached: a second read fetches again.
  Ask("127.0.0.2", server_->port(), "GET", "/v1/user-data", {"X-BC-Metadata-Token: " + a});
  EXPECT_EQ(fetches_, 2);
}

TEST_F(Imds, ASlowFetchForOneInstanceDoesNotHoldUpAnother) {
  std::string a = TokenFor("127.0.0.2"), b = TokenFor("127.0.0.3");
  hold_user_data_ = true;
  std::atomic<bool> a_done{false};
  std::thread slow([&] {
    Ask("127.0.0.2", server_->port(), "GET", "/v1/user-data", {"X-BC-Metadata-Token: " + a});
    a_done = true;
  });
  ASSERT_TRUE(bcd::testing::WaitFor([&] { return fetches_ > 0; })) << "vm-a's fetch never started";
  Reply meta =
      Ask("127.0.0.3", server_->port(), "GET", "/v1/meta-data", {"X-BC-Metadata-Token: " + b});
  EXPECT_EQ(meta.status, 200);
  EXPECT_FALSE(a_done) << "vm-b was answered while vm-a's fetch still waited";
  hold_user_data_ = false;
  slow.join();
}

TEST_F(Imds, TokensAreRequiredBoundToTheirAddressAndExpire) {
  EXPECT_EQ(Ask("127.0.0.2", server_->port(), "GET", "/v1/meta-data").status, 401);
  std::string a = TokenFor("127.0.0.2", 30);
  EXPECT_EQ(Ask("127.0.0.3", server_->port(), "GET", "/v1/meta-data", {"X-BC-Metadata-Token: " + a})
                .status,
            401)
      << "another instance cannot use vm-a's token";
  EXPECT_EQ(Ask("127.0.0.2", server_->port(), "GET", "/v1/meta-data", {"X-BC-Metadata-Token: " + a})
                .status,
            200);
  now_ += 30;
  EXPECT_EQ(Ask("127.0.0.2", server_->port(), "GET", "/v1/meta-data", {"X-BC-Metadata-Token: " + a})
                .status,
            401)
      << "expired";
}

TEST_F(Imds, RefusesStrangersRelaysAndBadTtls) {
  EXPECT_EQ(Ask("127.0.0.4", server_->port(), "PUT", "/v1/api/token",
                {"X-BC-Metadata-Token-TTL-Seconds: 60"})
                .status,
            404);
  EXPECT_EQ(Ask("127.0.0.4", server_->port(), "GET", "/v1/meta-data").status, 404);
  EXPECT_EQ(Ask("127.0.0.2", server_->port(), "PUT", "/v1/api/token",
                {"X-BC-Metadata-Token-TTL-Seconds: 60", "X-Forwarded-For: 10.0.0.9"})
                .status,
            403);
  for (const char* ttl : {"0", "21601", "soon", ""}) {
    Reply reply = Ask("127.0.0.2", server_->port(), "PUT", "/v1/api/token",
                      {std::string("X-BC-Metadata-Token-TTL-Seconds: ") + ttl});
    EXPECT_EQ(reply.status, 400) << ttl;
    EXPECT_EQ(reply.body, "X-BC-Metadata-Token-TTL-Seconds must be 1 to 21600\n");
  }
  std::string a = TokenFor("127.0.0.2");
  EXPECT_EQ(
      Ask("127.0.0.2", server_->port(), "POST", "/v1/meta-data", {"X-BC-Metadata-Token: " + a})
          .status,
      405);
  EXPECT_EQ(
      Ask("127.0.0.2", server_->port(), "GET", "/v1/nothing", {"X-BC-Metadata-Token: " + a}).status,
      404);
  // A header past the bound is answered 431.
  EXPECT_EQ(Ask("127.0.0.2", server_->port(), "GET", "/v1/meta-data",
                {"X-Big: " + std::string(20000, 'x')})
                .status,
            431);
  // The service is still there.
  EXPECT_EQ(Ask("127.0.0.2", server_->port(), "GET", "/v1/meta-data", {"X-BC-Metadata-Token: " + a})
                .status,
            200);
}

TEST_F(Imds, IdleConnectionsHoldNothingOthersNeedAndAreClosedAfterTheDeadline) {
  Start(std::chrono::milliseconds(500));
  // A hostile instance and an address no instance holds open connections and send nothing.
  std::vector<int> idle;
  for (int i = 0; i < 20; ++i) {
    for (const char* source : {"127.0.0.2", "127.0.0.9"}) {
      int fd = ConnectFrom(source, server_->port());
      if (fd >= 0) idle.push_back(fd);
    }
  }
  // Another instance is answered all the same.
  EXPECT_EQ(Ask("127.0.0.3", server_->port(), "PUT", "/v1/api/token",
                {"X-BC-Metadata-Token-TTL-Seconds: 60"})
                .status,
            200);
  int closed = 0;
  for (int fd : idle) {
    closed += ClosedByServer(fd);
    close(fd);
  }
  EXPECT_EQ(closed, static_cast<int>(idle.size())) << "an idle connection was kept";
}

TEST_F(Imds, StopClosesWhatIsOpenAtOnce) {
  Start(std::chrono::seconds(120));  // idle connections are not closed for their deadline here
  std::vector<int> idle;
  for (int i = 0; i < 4; ++i) idle.push_back(ConnectFrom("127.0.0.2", server_->port()));
  ASSERT_TRUE(Ask("127.0.0.3", server_->port(), "PUT", "/v1/api/token",
                  {"X-BC-Metadata-Token-TTL-Seconds: 60"})
                  .status == 200);  // the idle ones are in hand by now
  std::promise<void> stopped;
  std::thread stop([&] {
    server_.reset();
    stopped.set_value();
  });
  // A stop that waited for them would take two minutes.
  bool done = stopped.get_future().wait_for(std::chrono::seconds(20)) == std::future_status::ready;
  EXPECT_TRUE(done) << "the stop waited on idle connections";
  for (int fd : idle) {
    if (done) {
      EXPECT_TRUE(ClosedByServer(fd));
    }
    close(fd);  // (when the stop hangs, this lets it end)
  }
  stop.join();
}

TEST_F(Imds, EachAddressHoldsAtMostSixteenTokensItsOldestGoFirst) {
  std::vector<std::string> tokens;
  for (int i = 0; i < 20; ++i) tokens.push_back(TokenFor("127.0.0.2"));
  auto status = [&](const std::string& source, const std::string& token) {
    return Ask(source, server_->port(), "GET", "/v1/meta-data", {"X-BC-Metadata-Token: " + token})
        .status;
  };
  for (int i = 0; i < 4; ++i) EXPECT_EQ(status("127.0.0.2", tokens[i]), 401) << i;
  for (int i = 4; i < 20; ++i) EXPECT_EQ(status("127.0.0.2", tokens[i]), 200) << i;
  EXPECT_EQ(status("127.0.0.3", TokenFor("127.0.0.3")), 200) << "others are not crowded out";
}

TEST_F(Imds, RefusesForwardedAndTtlsThatAreNotPlainNumbers) {
  EXPECT_EQ(Ask("127.0.0.2", server_->port(), "PUT", "/v1/api/token",
                {"X-BC-Metadata-Token-TTL-Seconds: 60", "Forwarded: for=10.0.0.9"})
                .status,
            403);
  for (const char* ttl : {"60abc", "+60", "0x10", "60.5", "-1", "99999999999999999999"}) {
    EXPECT_EQ(Ask("127.0.0.2", server_->port(), "PUT", "/v1/api/token",
                  {std::string("X-BC-Metadata-Token-TTL-Seconds: ") + ttl})
                  .status,
              400)
        << ttl;
  }
}

TEST_F(Imds, TheAudienceIsAQueryParameterNotAnyTextInTheTarget) {
  std::string a = TokenFor("127.0.0.2");
  auto jwt = [&](const std::string& target) {
    return Ask("127.0.0.2", server_->port(), "GET", target, {"X-BC-Metadata-Token: " + a});
  };
  EXPECT_EQ(jwt("/v1/token?xaudience=evil&audience=sts%2Eexample").body,
            "jwt-for-vm-a-sts.example");
  EXPECT_EQ(jwt("/v1/token?note=audience=evil").body, "jwt-for-vm-a-") << "the default audience";
  EXPECT_EQ(jwt("/v1/token?audience=a%zz").status, 400);
}

TEST_F(Imds, AnUnknownSourceIsLoggedOncePerMinute) {
  for (int i = 0; i < 5; ++i) Ask("127.0.0.4", server_->port(), "GET", "/v1/meta-data");
  auto lines = [&] {
    std::string text = log_.Text();
    int n = 0;
    for (std::size_t at = text.find("event=imds.unknown_source address=127.0.0.4");
         at != std::string::npos;
         at = text.find("event=imds.unknown_source address=127.0.0.4", at + 1))
      ++n;
    return n;
  };
  EXPECT_EQ(lines(), 1);
  now_ += 60;
  Ask("127.0.0.4", server_->port(), "GET", "/v1/meta-data");
  EXPECT_EQ(lines(), 2);
}

// The TTLs of the TCP segments with data that 127.0.0.1:`port` sends to `to` while `act` runs,
// read from the IP headers of a raw socket's copies (root only). On loopback a copy is queued for
// the raw socket before the data reaches the receiving TCP socket, so once `act` has read its
// answer every copy is there to drain.
std::vector<int> TtlsOfAnswers(uint16_t port, const std::string& to,
                               const std::function<void()>& act) {
  int raw = socket(AF_INET, SOCK_RAW | SOCK_CLOEXEC, IPPROTO_TCP);
  if (raw < 0) return {};
  act();
  std::vector<int> ttls;
  in_addr_t destination = inet_addr(to.c_str());
  unsigned char packet[65536];
  ssize_t n;
  while ((n = recv(raw, packet, sizeof packet, MSG_DONTWAIT)) > 0) {
    std::size_t ip_header = (packet[0] & 0x0f) * 4u;
    if (static_cast<std::size_t>(n) < ip_header + 20) continue;
    in_addr_t daddr;
    std::memcpy(&daddr, packet + 16, 4);
    uint16_t source_port = static_cast<uint16_t>(packet[ip_header] << 8 | packet[ip_header + 1]);
    std::size_t tcp_header = (packet[ip_header + 12] >> 4) * 4u;
    bool data = static_cast<std::size_t>(n) > ip_header + tcp_header;
    if (daddr == destination && source_port == port && data) ttls.push_back(packet[8]);
  }
  close(raw);
  return ttls;
}

TEST_F(Imds, TheTokenAnswerLeavesWithAnIpTtlOfOne) {
  if (geteuid() != 0) GTEST_SKIP() << "reading IP headers needs a raw socket (root)";
  std::vector<int> put =
      TtlsOfAnswers(server_->port(), "127.0.0.2", [&] { TokenFor("127.0.0.2"); });
  ASSERT_FALSE(put.empty()) << "no answer seen";
  for (int ttl : put) EXPECT_EQ(ttl, 1);
  std::string b = TokenFor("127.0.0.3");
  std::vector<int> get = TtlsOfAnswers(server_->port(), "127.0.0.3", [&] {
    Ask("127.0.0.3", server_->port(), "GET", "/v1/meta-data", {"X-BC-Metadata-Token: " + b});
  });
  ASSERT_FALSE(get.empty());
  for (int ttl : get) EXPECT_GT(ttl, 1) << "only the token answer is held to one hop";
}

}  // namespace
}  // namespace bcd
