// The site agent's boot server and boot.prepareRamdisk / boot.cleanUp, end to end: commands come
// signed from the dev gateway, the discovery token is a secret bound to the command's step, pinned
// images come from Debian's nginx into the cache, and what a booting machine would ask is asked
// over real HTTP on loopback. (metal_boot_test.cc boots a QEMU machine from it.)

#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <sstream>
#include <string>

#include "bettercompute/agent/v1/ramdisk.pb.h"
#include "bettercompute/site/v1/site.pb.h"
#include "fmt/format.h"
#include "gtest/gtest.h"
#include "modes/site/site_mode.h"
#include "nlohmann/json.hpp"
#include "pki/base64url.h"
#include "pki/envelope.h"
#include "pki/keys.h"
#include "proto/signing_input.h"
#include "testing/child_process.h"
#include "testing/nginx.h"
#include "testing/wait.h"
#include "tests/integration/joined_node.h"
#include "tests/unit/fake_root.h"

namespace bcd {
namespace {

namespace v1 = bettercompute::agent::v1;
namespace site = bettercompute::site::v1;
using bcd::testing::ConnectLoopback;
using bcd::testing::Converse;
using bcd::testing::FakeRoot;
using bcd::testing::JoinedNode;
using bcd::testing::Nginx;
using std::chrono::seconds;

constexpr auto kWait = seconds(60);
constexpr char kMac[] = "52:54:00:12:34:56";
constexpr char kToken[] = "tok-0123456789abcdef-boot";
constexpr char kOtherToken[] = "tok-fedcba9876543210-boot";

std::string Sha256(const std::string& bytes) { return pki::Sha256(bytes); }

void WriteFile(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// A kernel-sized blob of bytes that differ along it (so a wrong range shows).
std::string Blob(std::size_t size, char seed) {
  std::string bytes(size, '\0');
  for (std::size_t i = 0; i < size; ++i) bytes[i] = static_cast<char>((i * 131 + seed) & 0xff);
  return bytes;
}

struct HttpAnswer {
  int status = 0;
  std::string head, body;
  std::string Header(const std::string& name) const {
    std::istringstream lines(head);
    std::string line;
    while (std::getline(lines, line)) {
      if (line.size() > name.size() + 1 &&
          strncasecmp(line.c_str(), (name + ":").c_str(), name.size() + 1) == 0) {
        std::string value = line.substr(name.size() + 1);
        while (!value.empty() && (value.front() == ' ')) value.erase(0, 1);
        while (!value.empty() && (value.back() == '\r' || value.back() == ' ')) value.pop_back();
        return value;
      }
    }
    return "";
  }
};

HttpAnswer Ask(uint16_t port, const std::string& request) {
  std::string raw = Converse(ConnectLoopback(port), request);
  HttpAnswer answer;
  std::size_t end = raw.find("\r\n\r\n");
  if (end == std::string::npos) return answer;
  answer.head = raw.substr(0, end);
  answer.body = raw.substr(end + 4);
  if (answer.head.starts_with("HTTP/1.1 ")) answer.status = std::atoi(answer.head.c_str() + 9);
  return answer;
}

HttpAnswer Get(uint16_t port, const std::string& path, const std::string& headers = "") {
  return Ask(port, fmt::format("GET {} HTTP/1.1\r\nHost: boot\r\n{}\r\n", path, headers));
}

HttpAnswer Post(uint16_t port, const std::string& body) {
  return Ask(port, fmt::format("POST /discovery HTTP/1.1\r\nHost: boot\r\nContent-Type: "
                               "application/json\r\nContent-Length: {}\r\n\r\n{}",
                               body.size(), body));
}

std::string DiscoveryBody(const std::string& token, const std::string& mac,
                          const std::string& nonce = "00112233445566778899aabbccddeeff") {
  return nlohmann::json{{"token", token}, {"mac", mac}, {"nonce", nonce}}.dump();
}

class Boot : public ::testing::Test {
 protected:
  // `boot` is false for an agent without a [boot] section.
  explicit Boot(bool boot = true)
      : port_(static_cast<uint16_t>(bcd::testing::FreeLoopbackPort())),
        node_(std::make_unique<JoinedNode>(JoinedNode::Options{
            .node_id = "n-1",
            .extra_config =
                [this, boot](const std::filesystem::path&) {
                  return boot ? fmt::format("[boot]\nlisten = \"127.0.0.1:{}\"\n", port_) : "";
                },
            .log_level = LogLevel::kDebug,
            .now = [this] { return bcd::testing::SystemNow() + skew_.load(); }})) {
    node_->gateway->AddSecret("boot/token", kToken, {"wf-1", "step-1", ""});
    node_->gateway->AddSecret("boot/other", kOtherToken, {"wf-1", "step-1", ""});
    node_->gateway->AddSecret("boot/spaced", "a token with spaces in it", {"wf-1", "step-1", ""});
    StartAgent();
  }
  ~Boot() override {
    node_->Stop();
    std::string log = node_->LogText();
    EXPECT_EQ(log.find(kToken), std::string::npos) << "a discovery token in the log:\n" << log;
  }

  void StartAgent() {
    node_->Start(std::make_unique<SiteMode>());
    ASSERT_TRUE(node_->gateway->WaitForWelcomes(++welcomes_, kWait));
  }
  void RestartAgent() {
    node_->Stop();
    StartAgent();
  }

  int64_t Now() const { return bcd::testing::SystemNow() + skew_.load(); }

  site::PrepareRamdiskPayload Entry(const std::string& mac = kMac, const std::string& id = "be-1",
                                    const std::string& token_ref = "boot/token") const {
    site::PrepareRamdiskPayload p;
    p.set_mac(mac);
    p.set_boot_entry_id(id);
    p.set_kernel_url("https://images.example/vmlinuz");
    p.set_initrd_url("https://images.example/initrd.img");
    p.set_cmdline("console=ttyS0 quiet");
    p.set_discovery_token_ref(token_ref);
    p.set_expires_at(static_cast<uint64_t>(Now() + 3600));
    return p;
  }

  v1::CommandUpdate Run(const std::string& id, const std::string& kind,
                        const google::protobuf::Message& payload) {
    node_->SendCommand(id, kind, payload, "wf-1", "step-1");
    return node_->WaitTerminal(id, kWait);
  }
  void Succeeds(const std::string& id, const std::string& kind,
                const google::protobuf::Message& payload) {
    v1::CommandUpdate update = Run(id, kind, payload);
    EXPECT_EQ(update.state(), v1::COMMAND_STATE_SUCCEEDED) << id << ": " << update.message();
  }
  std::string Failure(const std::string& id, const std::string& kind,
                      const google::protobuf::Message& payload) {
    v1::CommandUpdate update = Run(id, kind, payload);
    EXPECT_NE(update.state(), v1::COMMAND_STATE_SUCCEEDED) << id;
    return update.message();
  }

  // The events of `kind` the gateway received so far.
  std::vector<v1::Event> Events(const std::string& kind) const {
    std::vector<v1::Event> events;
    for (const auto& frame : node_->gateway->Received("n-1")) {
      if (frame.has_event() && frame.event().kind() == kind) events.push_back(frame.event());
    }
    return events;
  }

  std::filesystem::path CacheDir() const { return node_->config->state_dir() / "boot" / "cache"; }

  std::atomic<int64_t> skew_{0};
  uint16_t port_;
  int welcomes_ = 0;
  FakeRoot files_;
  std::unique_ptr<JoinedNode> node_;
};

TEST_F(Boot, APreparedEntryGetsItsScriptWithTheCommandLineAndUnpinnedImagesAreRedirected) {
  Succeeds("p-1", "boot.prepareRamdisk", Entry());
  HttpAnswer chain = Get(port_, "/boot.ipxe");
  EXPECT_EQ(chain.status, 200);
  EXPECT_NE(chain.body.find(
                fmt::format("chain http://127.0.0.1:{}/boot/${{net0/mac:hexhyp}}.ipxe", port_)),
            std::string::npos)
      << chain.body;

  for (std::string mac : {"52-54-00-12-34-56", "52:54:00:12:34:56", "52-54-00-12-34-56"}) {
    HttpAnswer script = Get(port_, "/boot/" + mac + ".ipxe");
    ASSERT_EQ(script.status, 200) << mac;
    EXPECT_TRUE(script.body.starts_with("#!ipxe\n")) << script.body;
    std::string base = fmt::format("http://127.0.0.1:{}", port_);
    EXPECT_NE(script.body.find(fmt::format(
                  "kernel {}/boot/52-54-00-12-34-56/kernel console=ttyS0 quiet initrd=initrd "
                  "bcd.boot={} bcd.gateway=",
                  base, base)),
              std::string::npos)
        << script.body;
    EXPECT_NE(
        script.body.find(fmt::format("bcd.mac={} bcd.entry=be-1 bcd.token={}\n", kMac, kToken)),
        std::string::npos)
        << script.body;
    EXPECT_NE(
        script.body.find(fmt::format("initrd {}/boot/52-54-00-12-34-56/initrd\nboot\n", base)),
        std::string::npos)
        << script.body;
  }
  HttpAnswer kernel = Get(port_, "/boot/52-54-00-12-34-56/kernel");
  EXPECT_EQ(kernel.status, 302);
  EXPECT_EQ(kernel.Header("Location"), "https://images.example/vmlinuz");
  EXPECT_EQ(Get(port_, "/boot/52-54-00-12-34-56/initrd").Header("Location"),
            "https://images.example/initrd.img");
  // Each answer is an access log line naming the MAC and the entry (never the token).
  EXPECT_NE(node_->LogText().find("boot.served"), std::string::npos);
  EXPECT_NE(node_->LogText().find("mac=52:54:00:12:34:56 entry=be-1"), std::string::npos)
      << node_->LogText();
}

TEST_F(Boot, AnUnknownMacIsToldToAskAgainAndAfterEnoughTriesToBootTheNextDevice) {
  HttpAnswer first = Get(port_, "/boot/aa-bb-cc-dd-ee-ff.ipxe");
  EXPECT_EQ(first.status, 200);
  EXPECT_NE(first.body.find("no boot entry for aa:bb:cc:dd:ee:ff"), std::string::npos);
  EXPECT_NE(first.body.find(fmt::format("sleep 10\nchain --replace "
                                        "http://127.0.0.1:{}/boot/aa-bb-cc-dd-ee-ff.ipxe?try=1",
                                        port_)),
            std::string::npos)
      << first.body;
  HttpAnswer later = Get(port_, "/boot/aa-bb-cc-dd-ee-ff.ipxe?try=7");
  EXPECT_NE(later.body.find("?try=8"), std::string::npos) << later.body;
  HttpAnswer last = Get(port_, "/boot/aa-bb-cc-dd-ee-ff.ipxe?try=30");
  EXPECT_NE(last.body.find("booting the next device\nexit 1\n"), std::string::npos) << last.body;
  EXPECT_EQ(last.body.find("chain"), std::string::npos) << last.body;
  EXPECT_EQ(Get(port_, "/boot/aa-bb-cc-dd-ee-ff/kernel").status, 404);
  EXPECT_EQ(Get(port_, "/boot/not-a-mac.ipxe").status, 404);
  EXPECT_EQ(Get(port_, "/etc/passwd").status, 404);
}

TEST_F(Boot, PinnedImagesAreCachedCheckedAndServedWithRanges) {
  std::string kernel = Blob(3 * 1024 * 1024 + 17, 'k'), initrd = Blob(700 * 1024, 'i');
  std::filesystem::create_directories(files_.path() / "www");
  WriteFile(files_.path() / "www" / "vmlinuz", kernel);
  WriteFile(files_.path() / "www" / "initrd.img", initrd);
  absl::StatusOr<std::unique_ptr<Nginx>> nginx =
      Nginx::Start(files_.path() / "nginx", {.root = files_.path() / "www"});
  ASSERT_TRUE(nginx.ok()) << nginx.status();
  site::PrepareRamdiskPayload entry = Entry();
  entry.set_kernel_url((*nginx)->url() + "/vmlinuz");
  entry.set_initrd_url((*nginx)->url() + "/initrd.img");
  entry.set_kernel_sha256(Sha256(kernel));
  entry.set_initrd_sha256(Sha256(initrd));
  Succeeds("p-1", "boot.prepareRamdisk", entry);
  nginx->reset();  // served from the cache from now on

  HttpAnswer whole = Get(port_, "/boot/52-54-00-12-34-56/kernel");
  EXPECT_EQ(whole.status, 200);
  EXPECT_EQ(whole.body.size(), kernel.size());
  EXPECT_TRUE(whole.body == kernel);
  EXPECT_EQ(whole.Header("Accept-Ranges"), "bytes");
  EXPECT_EQ(whole.Header("ETag"), "\"" + pki::Hex(Sha256(kernel)) + "\"");
  EXPECT_TRUE(Get(port_, "/boot/52-54-00-12-34-56/initrd").body == initrd);

  HttpAnswer part = Get(port_, "/boot/52-54-00-12-34-56/kernel", "Range: bytes=1000-1999\r\n");
  EXPECT_EQ(part.status, 206);
  EXPECT_EQ(part.Header("Content-Range"), fmt::format("bytes 1000-1999/{}", kernel.size()));
  EXPECT_TRUE(part.body == kernel.substr(1000, 1000));
  HttpAnswer tail = Get(port_, "/boot/52-54-00-12-34-56/kernel", "Range: bytes=-10\r\n");
  EXPECT_EQ(tail.status, 206);
  EXPECT_TRUE(tail.body == kernel.substr(kernel.size() - 10));
  HttpAnswer open_end = Get(port_, "/boot/52-54-00-12-34-56/initrd", "Range: bytes=700000-\r\n");
  EXPECT_EQ(open_end.status, 206);
  EXPECT_TRUE(open_end.body == initrd.substr(700000));
  HttpAnswer beyond = Get(port_, "/boot/52-54-00-12-34-56/kernel", "Range: bytes=99999999-\r\n");
  EXPECT_EQ(beyond.status, 416);
  EXPECT_EQ(beyond.Header("Content-Range"), fmt::format("bytes */{}", kernel.size()));
  // Several ranges, or one that is not understood: the whole file.
  EXPECT_EQ(Get(port_, "/boot/52-54-00-12-34-56/kernel", "Range: bytes=0-1,5-9\r\n").status, 200);
  EXPECT_EQ(Get(port_, "/boot/52-54-00-12-34-56/kernel", "Range: lines=1-2\r\n").status, 200);
  HttpAnswer head = Ask(port_, "HEAD /boot/52-54-00-12-34-56/kernel HTTP/1.1\r\nHost: b\r\n\r\n");
  EXPECT_EQ(head.status, 200);
  EXPECT_EQ(head.Header("Content-Length"), std::to_string(kernel.size()));
  EXPECT_TRUE(head.body.empty());

  // A cached file that no longer matches its pin is not served, not one byte.
  std::filesystem::path cached = CacheDir() / pki::Hex(Sha256(kernel));
  ASSERT_TRUE(std::filesystem::exists(cached));
  {
    std::fstream file(cached, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(4096);
    file.put('X');
  }
  HttpAnswer refused = Get(port_, "/boot/52-54-00-12-34-56/kernel");
  EXPECT_EQ(refused.status, 500);
  EXPECT_NE(refused.body.find("does not match its sha256"), std::string::npos) << refused.body;
  EXPECT_NE(node_->LogText().find("boot.cache_mismatch"), std::string::npos);
  EXPECT_EQ(refused.body.find(kernel.substr(0, 64)), std::string::npos);
}

TEST_F(Boot, AnImageThatDoesNotMatchItsPinFailsThePrepareAndLeavesNoEntry) {
  std::filesystem::create_directories(files_.path() / "www");
  WriteFile(files_.path() / "www" / "vmlinuz", Blob(4096, 'a'));
  absl::StatusOr<std::unique_ptr<Nginx>> nginx =
      Nginx::Start(files_.path() / "nginx", {.root = files_.path() / "www"});
  ASSERT_TRUE(nginx.ok()) << nginx.status();
  site::PrepareRamdiskPayload entry = Entry();
  entry.set_kernel_url((*nginx)->url() + "/vmlinuz");
  entry.set_kernel_sha256(Sha256("something else"));
  std::string message = Failure("p-1", "boot.prepareRamdisk", entry);
  EXPECT_NE(
      message.find("kernel_url: what it serves has sha256 " + pki::Hex(Sha256(Blob(4096, 'a')))),
      std::string::npos)
      << message;
  EXPECT_NE(message.find("the payload pins " + pki::Hex(Sha256("something else"))),
            std::string::npos)
      << message;
  EXPECT_NE(Get(port_, "/boot/52-54-00-12-34-56.ipxe").body.find("no boot entry"),
            std::string::npos);
  EXPECT_TRUE(std::filesystem::is_empty(CacheDir()));

  entry.set_kernel_url((*nginx)->url() + "/missing");
  message = Failure("p-2", "boot.prepareRamdisk", entry);
  EXPECT_NE(message.find("kernel_url: download from 127.0.0.1: the server answered 404"),
            std::string::npos)
      << message;
}

TEST_F(Boot, ATokenIsWorthOneSignedAssertionForItsMacAndEntry) {
  Succeeds("p-1", "boot.prepareRamdisk", Entry());
  Succeeds("p-2", "boot.prepareRamdisk", Entry("52:54:00:00:00:02", "be-2", "boot/other"));

  // Another MAC's token, and a MAC without an entry: refused, and each refusal an event.
  HttpAnswer wrong = Post(port_, DiscoveryBody(kOtherToken, kMac));
  EXPECT_EQ(wrong.status, 403);
  EXPECT_EQ(wrong.body, "not the token of this MAC's boot entry\n");
  HttpAnswer unknown = Post(port_, DiscoveryBody(kToken, "52:54:00:00:00:09"));
  EXPECT_EQ(unknown.status, 403);
  EXPECT_EQ(unknown.body, "no boot entry for this MAC\n");

  int64_t before = Now();
  HttpAnswer granted = Post(port_, DiscoveryBody(kToken, "52-54-00-12-34-56"));
  ASSERT_EQ(granted.status, 200) << granted.body;
  std::optional<std::string> bytes =
      pki::Base64UrlDecode(granted.body.substr(0, granted.body.find('\n')));
  ASSERT_TRUE(bytes.has_value());
  v1::SignedDiscoveryAssertion signed_assertion;
  ASSERT_TRUE(signed_assertion.ParseFromString(*bytes));
  // Signed by the site agent's node key, its chain leading to the fleet's node CA.
  EXPECT_TRUE(pki::VerifyWithChain(
                  proto::BodySigningInput(proto::Purpose::kDiscovery, signed_assertion.body()),
                  signed_assertion.signature(), {node_->pki.node_ca()}, Now())
                  .ok());
  EXPECT_FALSE(pki::VerifyWithChain(
                   proto::BodySigningInput(proto::Purpose::kGatewayProof, signed_assertion.body()),
                   signed_assertion.signature(), {node_->pki.node_ca()}, Now())
                   .ok());
  v1::DiscoveryAssertion assertion;
  ASSERT_TRUE(assertion.ParseFromString(signed_assertion.body()));
  EXPECT_FALSE(assertion.site().empty());
  EXPECT_EQ(assertion.mac(), kMac);
  EXPECT_EQ(assertion.workflow_id(), "wf-1");
  EXPECT_EQ(assertion.boot_entry_id(), "be-1");
  EXPECT_EQ(pki::Hex(assertion.nonce()), "00112233445566778899aabbccddeeff");
  EXPECT_GE(static_cast<int64_t>(assertion.iat()), before);
  EXPECT_EQ(assertion.exp() - assertion.iat(), 600u);

  // Used: refused from now on, and the script says so rather than handing the token out again.
  HttpAnswer again = Post(port_, DiscoveryBody(kToken, kMac, "ffeeddccbbaa99887766554433221100"));
  EXPECT_EQ(again.status, 403);
  EXPECT_EQ(again.body, "the token was used already\n");
  HttpAnswer script = Get(port_, "/boot/52-54-00-12-34-56.ipxe");
  EXPECT_NE(script.body.find("was used already"), std::string::npos) << script.body;
  EXPECT_EQ(script.body.find(kToken), std::string::npos) << script.body;

  ASSERT_TRUE(
      bcd::testing::WaitFor([&] { return Events("boot.discovery_refused").size() >= 3; }, kWait));
  std::vector<v1::Event> events = Events("boot.discovery_refused");
  EXPECT_NE(events[0].message().find("not the token of this MAC's boot entry"), std::string::npos);
  EXPECT_NE(events[1].message().find("no boot entry for this MAC"), std::string::npos);
  EXPECT_NE(events[2].message().find("used already"), std::string::npos);
  EXPECT_EQ(events[2].attributes().at("boot_entry_id"), "be-1");
  EXPECT_EQ(events[2].attributes().at("mac"), kMac);

  // Expired: the entry is gone, for its script and its token.
  skew_ += 7200;
  HttpAnswer expired = Post(port_, DiscoveryBody(kOtherToken, "52:54:00:00:00:02"));
  EXPECT_EQ(expired.status, 403);
  EXPECT_EQ(expired.body, "the boot entry expired\n");
  EXPECT_NE(Get(port_, "/boot/52-54-00-00-00-02.ipxe").body.find("no boot entry"),
            std::string::npos);
}

TEST_F(Boot, MalformedDiscoveryRequestsAndOversizedOnesAreRefusedWithoutUsingTheToken) {
  Succeeds("p-1", "boot.prepareRamdisk", Entry());
  EXPECT_EQ(Post(port_, "not json").status, 400);
  EXPECT_EQ(Post(port_, R"({"token": 1, "mac": "x", "nonce": "y"})").status, 400);
  EXPECT_EQ(Post(port_, DiscoveryBody(kToken, "52:54:00:12:34")).body, "mac: not a MAC address\n");
  EXPECT_EQ(Post(port_, DiscoveryBody(kToken, kMac, "abc")).status, 400);
  EXPECT_EQ(Post(port_, DiscoveryBody(kToken, kMac, "zz112233445566778899")).status, 400);
  EXPECT_EQ(Post(port_, std::string(5000, '{')).status, 413);
  EXPECT_EQ(Get(port_, "/discovery").status, 405);
  EXPECT_EQ(Ask(port_, "DELETE /boot.ipxe HTTP/1.1\r\nHost: b\r\n\r\n").status, 405);
  EXPECT_EQ(Get(port_, "/boot.ipxe", "X-Big: " + std::string(9000, 'a') + "\r\n").status, 431);
  EXPECT_EQ(Ask(port_, "GARBAGE\r\n\r\n").status, 400);
  // None of that used the token.
  EXPECT_EQ(Post(port_, DiscoveryBody(kToken, kMac)).status, 200);
}

TEST_F(Boot, EntriesAndUsedTokensSurviveARestart) {
  Succeeds("p-1", "boot.prepareRamdisk", Entry());
  Succeeds("p-2", "boot.prepareRamdisk", Entry("52:54:00:00:00:02", "be-2", "boot/other"));
  ASSERT_EQ(Post(port_, DiscoveryBody(kOtherToken, "52:54:00:00:00:02")).status, 200);
  struct stat st {};
  ASSERT_EQ(stat((node_->config->state_dir() / "boot" / "entries.json").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_EQ(stat((node_->config->state_dir() / "boot").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);

  RestartAgent();
  HttpAnswer script = Get(port_, "/boot/52-54-00-12-34-56.ipxe");
  EXPECT_NE(script.body.find("bcd.entry=be-1"), std::string::npos) << script.body;
  EXPECT_EQ(Post(port_, DiscoveryBody(kOtherToken, "52:54:00:00:00:02")).body,
            "the token was used already\n");
  EXPECT_EQ(Post(port_, DiscoveryBody(kToken, kMac)).status, 200);
}

TEST_F(Boot, CleanUpRemovesTheEntryAndTheCacheFilesNoEntryNames) {
  std::string kernel = Blob(10000, 'c');
  std::filesystem::create_directories(files_.path() / "www");
  WriteFile(files_.path() / "www" / "vmlinuz", kernel);
  absl::StatusOr<std::unique_ptr<Nginx>> nginx =
      Nginx::Start(files_.path() / "nginx", {.root = files_.path() / "www"});
  ASSERT_TRUE(nginx.ok()) << nginx.status();
  site::PrepareRamdiskPayload entry = Entry();
  entry.set_kernel_url((*nginx)->url() + "/vmlinuz");
  entry.set_kernel_sha256(Sha256(kernel));
  Succeeds("p-1", "boot.prepareRamdisk", entry);
  EXPECT_TRUE(std::filesystem::exists(CacheDir() / pki::Hex(Sha256(kernel))));

  site::BootCleanUpPayload other;
  other.set_mac(kMac);
  other.set_boot_entry_id("be-9");  // another entry's id: this one stays
  v1::CommandUpdate kept = Run("c-0", "boot.cleanUp", other);
  site::BootCleanUpResult result;
  ASSERT_TRUE(result.ParseFromString(kept.result()));
  EXPECT_FALSE(result.removed());

  site::BootCleanUpPayload clean;
  clean.set_mac(kMac);
  clean.set_boot_entry_id("be-1");
  v1::CommandUpdate update = Run("c-1", "boot.cleanUp", clean);
  EXPECT_EQ(update.state(), v1::COMMAND_STATE_SUCCEEDED) << update.message();
  ASSERT_TRUE(result.ParseFromString(update.result()));
  EXPECT_TRUE(result.removed());
  EXPECT_NE(Get(port_, "/boot/52-54-00-12-34-56.ipxe").body.find("no boot entry"),
            std::string::npos);
  EXPECT_TRUE(std::filesystem::is_empty(CacheDir()));
  update = Run("c-2", "boot.cleanUp", clean);
  ASSERT_TRUE(result.ParseFromString(update.result()));
  EXPECT_FALSE(result.removed());
}

TEST_F(Boot, PayloadsThatWouldMisleadTheScriptOrTheMachineAreRefusedByName) {
  auto refused = [&](const std::string& id, site::PrepareRamdiskPayload p) {
    return Failure(id, "boot.prepareRamdisk", p);
  };
  site::PrepareRamdiskPayload p = Entry();
  p.set_mac("52:54:00:12:34:5G");
  EXPECT_NE(refused("r-1", p).find("mac: expected a lowercase colon-separated MAC"),
            std::string::npos);
  p = Entry();
  p.set_cmdline("quiet\nshell");
  EXPECT_NE(refused("r-2", p).find("cmdline: a control character"), std::string::npos);
  p = Entry();
  p.set_kernel_url("https://images.example/a b");
  EXPECT_NE(refused("r-3", p).find("kernel_url"), std::string::npos);
  p = Entry();
  p.set_initrd_url("ftp://images.example/initrd");
  EXPECT_NE(refused("r-4", p).find("initrd_url"), std::string::npos);
  p = Entry();
  p.set_kernel_sha256("short");
  EXPECT_NE(refused("r-5", p).find("kernel_sha256: expected 32 bytes or none, got 5"),
            std::string::npos);
  p = Entry();
  p.set_expires_at(static_cast<uint64_t>(Now() - 1));
  EXPECT_NE(refused("r-6", p).find("expires_at"), std::string::npos);
  p = Entry();
  p.set_boot_entry_id("be 1");
  EXPECT_NE(refused("r-7", p).find("boot_entry_id"), std::string::npos);
  std::string spaced = refused("r-8", Entry(kMac, "be-1", "boot/spaced"));
  EXPECT_NE(spaced.find("the discovery token of boot/spaced must be"), std::string::npos);
  EXPECT_EQ(spaced.find("a token with spaces"), std::string::npos) << spaced;
  EXPECT_NE(refused("r-9", Entry(kMac, "be-1", "boot/nothing")).find("boot/nothing"),
            std::string::npos);
  EXPECT_NE(Get(port_, "/boot/52-54-00-12-34-56.ipxe").body.find("no boot entry"),
            std::string::npos);
}

class NoBoot : public Boot {
 protected:
  NoBoot() : Boot(false) {}
};

TEST_F(NoBoot, WithoutABootSectionTheKindsRefuseAndNothingListens) {
  EXPECT_NE(Failure("p-1", "boot.prepareRamdisk", Entry()).find("no [boot] section"),
            std::string::npos);
  site::BootCleanUpPayload clean;
  clean.set_mac(kMac);
  EXPECT_NE(Failure("c-1", "boot.cleanUp", clean).find("no [boot] section"), std::string::npos);
  EXPECT_LT(ConnectLoopback(port_), 0);
}

}  // namespace
}  // namespace bcd
