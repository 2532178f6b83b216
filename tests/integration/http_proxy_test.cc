// site.httpProxy end to end: signed commands from the dev gateway, Debian's nginx over http and
// https (its own certificate, trusted through [site] http_proxy_ca_file) as the site's services,
// secret headers from the dev broker, and the destination rules of [site] http_proxy_allow.

#include "modes/site/http_proxy.h"

#include <unistd.h>

#include <string>

#include "bettercompute/site/v1/site.pb.h"
#include "fmt/format.h"
#include "gtest/gtest.h"
#include "modes/site/site_mode.h"
#include "testing/child_process.h"
#include "testing/nginx.h"
#include "tests/integration/joined_node.h"
#include "tests/unit/fake_root.h"

namespace bcd {
namespace {

namespace v1 = bettercompute::agent::v1;
namespace site = bettercompute::site::v1;
using bcd::testing::FakeRoot;
using bcd::testing::JoinedNode;
using bcd::testing::Nginx;
using std::chrono::seconds;

constexpr char kSecret[] = "Bearer s3cret-site-token";

std::unique_ptr<Nginx> StartNginx(const std::filesystem::path& dir, bool tls) {
  std::filesystem::create_directories(dir / "www");
  std::ofstream(dir / "www" / "hello.txt") << "hello from the site\n";
  std::ofstream(dir / "www" / "big.bin") << std::string(5000, 'b');
  absl::StatusOr<std::unique_ptr<Nginx>> nginx = Nginx::Start(
      dir / "nginx", {.root = dir / "www",
                      .tls = tls,
                      .extra = "    location = /old { return 302 /hello.txt; }\n"
                               "    location = /echo { return 200 "
                               "\"auth=$http_authorization method=$request_method\"; }\n"});
  EXPECT_TRUE(nginx.ok()) << nginx.status();
  return nginx.ok() ? *std::move(nginx) : nullptr;
}

class HttpProxy : public ::testing::Test {
 protected:
  HttpProxy()
      : http_(StartNginx(files_.path() / "http", false)),
        https_(StartNginx(files_.path() / "https", true)),
        silent_fd_(bcd::testing::ListenOnLoopback(&silent_port_)) {
    node_ = std::make_unique<JoinedNode>(JoinedNode::Options{
        .node_id = "n-1", .extra_config = [this](const std::filesystem::path&) {
          // Loopback only where a rule names it: the two nginx ports and the silent server;
          // 0.0.0.0/0 reaches everything else but never loopback.
          return fmt::format(
              "[site]\nhttp_proxy_allow = [\"127.0.0.1:{}\", \"127.0.0.1:{}\", "
              "\"127.0.0.1/32:{}\", \"0.0.0.0/0:*\"]\nhttp_proxy_ca_file = \"{}\"\n",
              http_->port(), https_->port(), silent_port_, https_->cert().string());
        }});
    node_->gateway->AddSecret("site/auth", kSecret, {"wf-1", "step-1", ""});
    SiteModeOptions options;
    options.resolve = [](const std::string& host) -> std::vector<std::string> {
      if (host == "localhost" || host == "loopy.site") return {"127.0.0.1"};
      if (host == "nginx.site") return {"127.0.0.1"};
      return {};
    };
    node_->Start(std::make_unique<SiteMode>(options));
    EXPECT_TRUE(node_->gateway->WaitForWelcomes(1, seconds(60)));
  }
  ~HttpProxy() override {
    node_->Stop();
    std::string log = node_->LogText();
    EXPECT_EQ(log.find("s3cret-site-token"), std::string::npos) << log;
    if (silent_fd_ >= 0) close(silent_fd_);
  }

  site::HttpProxyPayload Get(const std::string& url) const {
    site::HttpProxyPayload p;
    p.set_method("GET");
    p.set_url(url);
    return p;
  }
  v1::CommandUpdate Run(const std::string& id, const site::HttpProxyPayload& p,
                        uint32_t timeout_seconds = 0) {
    node_->SendCommand(id, "site.httpProxy", p, "wf-1", "step-1", timeout_seconds);
    return node_->WaitTerminal(id, seconds(60));
  }
  site::HttpProxyResult Result(const std::string& id, const site::HttpProxyPayload& p) {
    v1::CommandUpdate update = Run(id, p);
    EXPECT_EQ(update.state(), v1::COMMAND_STATE_SUCCEEDED) << id << ": " << update.message();
    site::HttpProxyResult result;
    EXPECT_TRUE(result.ParseFromString(update.result()));
    return result;
  }

  FakeRoot files_;
  std::unique_ptr<Nginx> http_, https_;
  uint16_t silent_port_ = 0;
  int silent_fd_;
  std::unique_ptr<JoinedNode> node_;
};

TEST_F(HttpProxy, OneRequestOverHttpAndHttpsWithItsStatusHeadersAndBody) {
  site::HttpProxyResult plain = Result("h-1", Get(http_->url() + "/hello.txt"));
  EXPECT_EQ(plain.status(), 200u);
  EXPECT_EQ(plain.body(), "hello from the site\n");
  EXPECT_FALSE(plain.truncated());
  EXPECT_EQ(plain.headers().at("server").substr(0, 5), "nginx");
  EXPECT_EQ(plain.headers().at("content-length"), "20");

  site::HttpProxyResult tls = Result("h-2", Get(https_->url() + "/hello.txt"));
  EXPECT_EQ(tls.status(), 200u);
  EXPECT_EQ(tls.body(), "hello from the site\n");

  // A name: resolved once, then the address decided and connected to.
  site::HttpProxyResult named =
      Result("h-3", Get(fmt::format("http://nginx.site:{}/hello.txt", http_->port())));
  EXPECT_EQ(named.status(), 200u);

  site::HttpProxyPayload post = Get(http_->url() + "/echo");
  post.set_method("POST");
  post.set_body("x=1");
  EXPECT_EQ(Result("h-4", post).body(), "auth= method=POST");
  EXPECT_EQ(Result("h-5", Get(http_->url() + "/missing")).status(), 404u);
}

TEST_F(HttpProxy, SecretHeadersAreSentAndNeverShownBack) {
  site::HttpProxyPayload p = Get(http_->url() + "/echo");
  (*p.mutable_secret_headers())["Authorization"] = "site/auth";
  (*p.mutable_headers())["X-Plain"] = "yes";
  site::HttpProxyResult result = Result("s-1", p);
  EXPECT_EQ(result.status(), 200u);
  // nginx echoed the header: it arrived, and the result does not carry it back.
  EXPECT_EQ(result.body(), "auth=[redacted] method=GET");
  v1::CommandUpdate missing = Run("s-2", [&] {
    site::HttpProxyPayload q = Get(http_->url() + "/echo");
    (*q.mutable_secret_headers())["Authorization"] = "site/nothing";
    return q;
  }());
  EXPECT_EQ(missing.state(), v1::COMMAND_STATE_FAILED);
  EXPECT_NE(missing.message().find("site/nothing"), std::string::npos) << missing.message();
}

TEST_F(HttpProxy, ABodyOverTheBoundIsCutAndRedirectsAreReturnedNotFollowed) {
  site::HttpProxyPayload big = Get(http_->url() + "/big.bin");
  big.set_max_response_bytes(1000);
  site::HttpProxyResult cut = Result("b-1", big);
  EXPECT_EQ(cut.status(), 200u);
  EXPECT_EQ(cut.body(), std::string(1000, 'b'));
  EXPECT_TRUE(cut.truncated());
  big.set_max_response_bytes(5000);
  site::HttpProxyResult whole = Result("b-2", big);
  EXPECT_EQ(whole.body().size(), 5000u);
  EXPECT_FALSE(whole.truncated());

  site::HttpProxyResult redirect = Result("r-1", Get(http_->url() + "/old"));
  EXPECT_EQ(redirect.status(), 302u);
  EXPECT_NE(redirect.headers().at("location").find("/hello.txt"), std::string::npos);
  EXPECT_EQ(redirect.body().find("hello from the site"), std::string::npos);
}

TEST_F(HttpProxy, DestinationsOutsideTheRulesAndLoopbackByAWiderRuleAreRefused) {
  int other = bcd::testing::FreeLoopbackPort();
  v1::CommandUpdate port = Run("d-1", Get(fmt::format("http://127.0.0.1:{}/", other)));
  EXPECT_EQ(port.state(), v1::COMMAND_STATE_FAILED);
  EXPECT_NE(port.message().find("127.0.0.1 is a loopback or link-local address"), std::string::npos)
      << port.message();
  v1::CommandUpdate named = Run("d-2", Get("http://loopy.site:9/"));
  EXPECT_NE(named.message().find("loopy.site is not a destination site.httpProxy may reach: "
                                 "127.0.0.1 is a loopback or link-local address"),
            std::string::npos)
      << named.message();
  v1::CommandUpdate metadata = Run("d-3", Get("http://169.254.169.254/latest/meta-data"));
  EXPECT_NE(metadata.message().find("169.254.169.254 is a loopback or link-local address"),
            std::string::npos)
      << metadata.message();
  v1::CommandUpdate mapped = Run("d-4", Get("http://[::ffff:127.0.0.1]:9/"));
  EXPECT_NE(mapped.message().find("127.0.0.1 is a loopback"), std::string::npos)
      << mapped.message();
  v1::CommandUpdate unknown = Run("d-5", Get("http://nowhere.site/"));
  EXPECT_NE(unknown.message().find("nowhere.site: the name does not resolve"), std::string::npos)
      << unknown.message();
  v1::CommandUpdate header = Run("d-6", [&] {
    site::HttpProxyPayload p = Get(http_->url() + "/");
    (*p.mutable_headers())["Host"] = "elsewhere";
    return p;
  }());
  EXPECT_NE(header.message().find("header \"Host\" is not allowed"), std::string::npos)
      << header.message();
}

TEST_F(HttpProxy, ASilentServerEndsWithTheCommandsTime) {
  auto start = std::chrono::steady_clock::now();
  v1::CommandUpdate update =
      Run("t-1", Get(fmt::format("http://127.0.0.1:{}/slow", silent_port_)), 2);
  EXPECT_EQ(update.state(), v1::COMMAND_STATE_TIMED_OUT) << update.message();
  EXPECT_LT(std::chrono::steady_clock::now() - start, seconds(20));
}

TEST(HttpProxyRules, LoopbackAndLinkLocalOnlyByARuleNamingThem) {
  auto rules = [](std::vector<std::string> texts) {
    std::vector<TunnelAllowRule> out;
    for (const std::string& text : texts) out.push_back(*TunnelAllowRule::Parse(text));
    return out;
  };
  EXPECT_TRUE(CheckProxyDestination(rules({"10.20.0.0/16:*"}), "10.20.3.4", 443).ok());
  EXPECT_FALSE(CheckProxyDestination(rules({"10.20.0.0/16:80"}), "10.20.3.4", 443).ok());
  EXPECT_FALSE(CheckProxyDestination({}, "10.20.3.4", 443).ok());
  EXPECT_FALSE(CheckProxyDestination(rules({"0.0.0.0/0:*"}), "127.0.0.1", 80).ok());
  EXPECT_FALSE(CheckProxyDestination(rules({"0.0.0.0/0:*"}), "169.254.169.254", 80).ok());
  EXPECT_FALSE(CheckProxyDestination(rules({"::/0:*"}), "::1", 80).ok());
  EXPECT_FALSE(CheckProxyDestination(rules({"::/0:*"}), "fe80::1", 80).ok());
  EXPECT_FALSE(CheckProxyDestination(rules({"0.0.0.0/0:*"}), "::ffff:127.0.0.1", 80).ok());
  EXPECT_TRUE(CheckProxyDestination(rules({"127.0.0.1:80"}), "127.0.0.1", 80).ok());
  EXPECT_TRUE(CheckProxyDestination(rules({"169.254.169.254/32:*"}), "169.254.169.254", 80).ok());
  EXPECT_FALSE(CheckProxyDestination(rules({"0.0.0.0/0:*"}), "0.0.0.0", 80).ok());
  EXPECT_FALSE(CheckProxyDestination(rules({"0.0.0.0/0:*"}), "224.0.0.1", 80).ok());
}

}  // namespace
}  // namespace bcd
