// bcd join against the dev gateway: real gRPC over real TLS 1.3 on loopback, real files.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sstream>
#include <thread>

#include "app/cli.h"
#include "daemon/identity/identity.h"
#include "gtest/gtest.h"
#include "pki/keys.h"
#include "testing/child_process.h"
#include "testing/dev_gateway.h"
#include "testing/wait.h"
#include "tests/unit/fake_root.h"

namespace bcd {
namespace {

using bcd::testing::DevGateway;
using bcd::testing::DevPki;
using bcd::testing::FakeRoot;

struct Result {
  int code;
  std::string out, err;
};

class Join : public ::testing::Test {
 protected:
  Join() : pki_(*DevPki::Create(std::time(nullptr))) {
    gateway_ = *DevGateway::Start(pki_, {});
    WriteConfig(pki_.ServingCaPinHex(), DevPki::kGatewayName);
  }

  void WriteConfig(const std::string& pin, const std::string& server_name, int port = 0) {
    dir_.Write(
        "config.toml",
        "gateway_url = \"https://127.0.0.1:" + std::to_string(port ? port : gateway_->port()) +
            "\"\ngateway_server_name = \"" + server_name + "\"\ngateway_ca_spki_sha256 = \"" + pin +
            "\"\nstate_dir = \"" + (dir_.path() / "state").string() + "\"\n");
  }

  Result Run(std::vector<std::string> args, std::istream* in = nullptr) {
    std::ostringstream out, err;
    CliEnv env{.out = out,
               .err = err,
               .in = in,
               .root = dir_.path() / "no-such-root",
               .architecture = "x86_64",
               .runner = nullptr,
               .now = now_,
               .sleep = [this](std::chrono::seconds s) { sleeps_.push_back(s); },
               .default_config = dir_.path() / "config.toml"};
    int code = RunCli(args, env);
    return {code, out.str(), err.str()};
  }

  FakeRoot dir_;
  DevPki pki_;
  std::unique_ptr<DevGateway> gateway_;
  std::vector<std::chrono::seconds> sleeps_;
  std::function<uint64_t()> now_ = [] { return static_cast<uint64_t>(std::time(nullptr)); };
};

// The installer's way: the token on stdin (never on a command line, where ps shows it), or in a
// file.
TEST_F(Join, ReadsTheTokenFromStdinOrAFile) {
  std::istringstream in(gateway_->AddJoinToken("n-stdin") + "\r\n");
  Result r = Run({"join", "--token-file", "-"}, &in);
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_NE(r.out.find("joined as spiffe://dev.test/site/dev/node/n-stdin"), std::string::npos);

  Result both = Run({"join", "--token", "x", "--token-file", "-"});
  EXPECT_EQ(both.code, kExitUsage);
  EXPECT_EQ(both.err, "bcd join: give --token or --token-file, not both\n");
  dir_.Write("empty-token", "\n");
  Result empty = Run({"join", "--token-file", (dir_.path() / "empty-token").string()});
  EXPECT_EQ(empty.code, kExitUsage);
  EXPECT_NE(empty.err.find("no token in it"), std::string::npos) << empty.err;
  Result missing = Run({"join", "--token-file", (dir_.path() / "nope").string()});
  EXPECT_EQ(missing.code, kExitUsage);
  EXPECT_NE(missing.err.find("bcd join: --token-file " + (dir_.path() / "nope").string()),
            std::string::npos)
      << missing.err;
}

TEST_F(Join, JoinsWithATokenAndStoresTheIdentity) {
  Result r = Run({"join", "--token", gateway_->AddJoinToken("n-1")});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_NE(r.out.find("joined as spiffe://dev.test/site/dev/node/n-1"), std::string::npos)
      << r.out;
  struct stat st {};
  ASSERT_EQ(stat((dir_.path() / "state").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ASSERT_EQ(stat((dir_.path() / "state" / "identity.pem").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  Identity identity = *StateDir::Open(dir_.path() / "state")->LoadIdentity();
  EXPECT_EQ(identity.node.id.node(), "n-1");
  EXPECT_EQ(identity.node.generation, 1u);
  EXPECT_EQ(identity.join_service_key.SpkiDer(), pki_.join_service_key().Public().SpkiDer());
  EXPECT_EQ(identity.chain.front().Key()->SpkiDer(), identity.key.Public().SpkiDer());
  EXPECT_EQ(gateway_->joins_granted(), 1);
}

TEST_F(Join, ATokenWorksOnce) {
  std::string token = gateway_->AddJoinToken("n-1");
  ASSERT_EQ(Run({"join", "--token", token}).code, kExitOk);
  std::filesystem::remove_all(dir_.path() / "state");
  Result r = Run({"join", "--token", token});
  EXPECT_EQ(r.code, kExitJoinRefused);
  EXPECT_EQ(r.err, "bcd join: join refused (token-used): the join token was used\n");
}

TEST_F(Join, AnUnknownTokenIsRefusedWithItsReason) {
  Result r = Run({"join", "--token", "bcdjt_nope"});
  EXPECT_EQ(r.code, kExitJoinRefused);
  EXPECT_EQ(r.err, "bcd join: join refused (invalid-token): unknown join token\n");
  EXPECT_FALSE(std::filesystem::exists(dir_.path() / "state" / "identity.pem"));
}

TEST_F(Join, ANodeThatJoinedDoesNotJoinAgain) {
  ASSERT_EQ(Run({"join", "--token", gateway_->AddJoinToken("n-1")}).code, kExitOk);
  Result r = Run({"join", "--token", gateway_->AddJoinToken("n-1")});
  EXPECT_EQ(r.code, kExitOther);
  EXPECT_EQ(r.err, "bcd join: this node has already joined (identity in " +
                       (dir_.path() / "state").string() + "); remove it to join again\n");
}

TEST_F(Join, ADeferredJoinComesBackWithTheSameCsrAfterTheDelay) {
  gateway_->DeferJoins(2, 7);
  Result r = Run({"join", "--token", gateway_->AddJoinToken("n-1")});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_EQ(sleeps_,
            (std::vector<std::chrono::seconds>{std::chrono::seconds(7), std::chrono::seconds(7)}));
  EXPECT_EQ(gateway_->join_calls(), 3);  // the gateway refuses a changed CSR (csr-changed)
  EXPECT_NE(
      r.out.find("join deferred (deferred by the dev gateway); retrying in 7 s with the same CSR"),
      std::string::npos);
}

TEST_F(Join, RefusesAGatewayThatIsNotUnderThePinnedCa) {
  DevPki other = *DevPki::Create(std::time(nullptr));
  WriteConfig(other.ServingCaPinHex(), DevPki::kGatewayName);
  Result r = Run({"join", "--token", gateway_->AddJoinToken("n-1")});
  EXPECT_EQ(r.code, kExitOther);
  EXPECT_EQ(r.err,
            "bcd join: cannot reach the gateway at 127.0.0.1:" + std::to_string(gateway_->port()) +
                ": the gateway's certificate chain does not lead to the pinned CA (SPKI sha256 " +
                other.ServingCaPinHex() + ")\n");
  EXPECT_EQ(gateway_->join_calls(), 0);
}

// The gateway's certificates are checked against bcd's clock (the one the CLI is given), not the
// system's behind its back: twenty years on, the dev gateway's serving certificate has expired.
TEST_F(Join, ChecksTheGatewayCertificateAgainstItsOwnClock) {
  now_ = [] { return static_cast<uint64_t>(std::time(nullptr)) + 20ull * 365 * 86400; };
  Result r = Run({"join", "--token", gateway_->AddJoinToken("n-1")});
  EXPECT_EQ(r.code, kExitOther);
  EXPECT_NE(r.err.find("certificate has expired"), std::string::npos) << r.err;
  EXPECT_EQ(gateway_->join_calls(), 0);
}

TEST_F(Join, RefusesAGatewayCertificateForAnotherName) {
  WriteConfig(pki_.ServingCaPinHex(), "gw.other.test");
  Result r = Run({"join", "--token", gateway_->AddJoinToken("n-1")});
  EXPECT_EQ(r.code, kExitOther);
  EXPECT_NE(r.err.find("the gateway's certificate (CN = gw.dev.test) is not valid for the name "
                       "\"gw.other.test\""),
            std::string::npos)
      << r.err;
  EXPECT_EQ(gateway_->join_calls(), 0);
}

bool Accepts(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  close(fd);
  return ok;
}

// `openssl s_server` serving the dev gateway's own certificate, so only the TLS version differs.
class OpensslServer {
 public:
  OpensslServer(const FakeRoot& dir, const DevPki& pki, const std::string& version)
      : port_(bcd::testing::FreeLoopbackPort()) {
    dir.Write("s_server.key", pki.serving_key().ToPem());
    dir.Write("s_server.pem", pki.ServingChainPem());
    pid_ = bcd::testing::SpawnChild(
        {"openssl", "s_server", version, "-quiet", "-accept", std::to_string(port_), "-key",
         (dir.path() / "s_server.key").string(), "-cert", (dir.path() / "s_server.pem").string()});
    bcd::testing::WaitFor([&] { return Accepts(port_); }, std::chrono::seconds(10));
  }
  ~OpensslServer() {
    kill(pid_, SIGTERM);
    bcd::testing::WaitChild(pid_);
  }
  int port() const { return port_; }

 private:
  int port_;
  pid_t pid_ = 0;
};

TEST_F(Join, RefusesATls12OnlyServer) {
  OpensslServer server(dir_, pki_, "-tls1_2");
  ASSERT_TRUE(Accepts(server.port()));
  WriteConfig(pki_.ServingCaPinHex(), DevPki::kGatewayName, server.port());
  Result r = Run({"join", "--token", "t"});
  EXPECT_EQ(r.code, kExitOther);
  EXPECT_NE(r.err.find("cannot reach the gateway at 127.0.0.1:" + std::to_string(server.port())),
            std::string::npos);
  EXPECT_NE(r.err.find("protocol version"), std::string::npos) << r.err;
}

TEST_F(Join, ATls13ServerGetsPastTheVersionCheck) {
  // The control for the test above: the same server at TLS 1.3 fails later (it speaks no HTTP/2).
  OpensslServer server(dir_, pki_, "-tls1_3");
  ASSERT_TRUE(Accepts(server.port()));
  WriteConfig(pki_.ServingCaPinHex(), DevPki::kGatewayName, server.port());
  Result r = Run({"join", "--token", "t"});
  EXPECT_EQ(r.code, kExitOther);
  EXPECT_EQ(r.err.find("protocol version"), std::string::npos) << r.err;
}

TEST_F(Join, NeedsATokenOrANodeId) {
  EXPECT_EQ(Run({"join"}).err,
            "bcd join: give either --token T (or --token-file F) or --node-id N\n");
  EXPECT_EQ(Run({"join", "--token", "a", "--role", "ramdisk"}).err,
            "bcd join: --role must be node or site, got \"ramdisk\"\n");
  EXPECT_EQ(Run({"join", "--token"}).code, kExitUsage);
}

}  // namespace
}  // namespace bcd

namespace bcd {
namespace {

TEST_F(Join, AProvisionedMachineJoinsWithItsNodeIdAndCredential) {
  dir_.Write("credential", gateway_->AddProvisioningCredential("n-7"));
  Result r =
      Run({"join", "--node-id", "n-7", "--credential-file", (dir_.path() / "credential").string()});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_EQ(StateDir::Open(dir_.path() / "state")->LoadIdentity()->node.id.node(), "n-7");
}

TEST_F(Join, AWrongProvisioningCredentialIsRefused) {
  gateway_->AddProvisioningCredential("n-7");
  dir_.Write("credential", "bcdpc_wrong");
  Result r =
      Run({"join", "--node-id", "n-7", "--credential-file", (dir_.path() / "credential").string()});
  EXPECT_EQ(r.code, kExitJoinRefused);
  EXPECT_EQ(r.err,
            "bcd join: join refused (invalid-credential): no such provisioning credential for this "
            "node\n");
}

TEST_F(Join, AnExpiredTokenIsRefused) {
  Result r = Run({"join", "--token", gateway_->AddJoinToken("n-1", /*ttl=*/0)});
  EXPECT_EQ(r.code, kExitJoinRefused);
  EXPECT_EQ(r.err, "bcd join: join refused (token-expired): the join token expired\n");
}

TEST_F(Join, RefusesAJoinServiceKeyOtherThanThePinnedOne) {
  std::string other_pin = pki::Hex(pki::PrivateKey::Generate()->Public().SpkiSha256());
  dir_.Write("config.toml",
             "gateway_url = \"https://127.0.0.1:" + std::to_string(gateway_->port()) +
                 "\"\ngateway_server_name = \"gw.dev.test\"\ngateway_ca_spki_sha256 = \"" +
                 pki_.ServingCaPinHex() + "\"\njoin_service_key_sha256 = \"" + other_pin +
                 "\"\nstate_dir = \"" + (dir_.path() / "state").string() + "\"\n");
  Result r = Run({"join", "--token", gateway_->AddJoinToken("n-1")});
  EXPECT_EQ(r.code, kExitOther);
  EXPECT_EQ(r.err, "bcd join: join answer refused: the JoinService key (SPKI sha256 " +
                       pki::Hex(pki_.join_service_key().Public().SpkiSha256()) +
                       ") is not the pinned one (" + other_pin + ")\n");
  EXPECT_FALSE(std::filesystem::exists(dir_.path() / "state" / "identity.pem"));
}

TEST_F(Join, RefusesAGatewayServingAChainFromAnotherCa) {
  DevPki other = *DevPki::Create(std::time(nullptr));
  auto impostor = *DevGateway::Start(other, {});
  WriteConfig(pki_.ServingCaPinHex(), DevPki::kGatewayName, impostor->port());
  Result r = Run({"join", "--token", "t"});
  EXPECT_EQ(r.code, kExitOther);
  EXPECT_NE(r.err.find("the gateway's certificate chain does not lead to the pinned CA"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(impostor->join_calls(), 0);
}

}  // namespace
}  // namespace bcd
