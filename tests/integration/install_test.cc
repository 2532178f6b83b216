// The generated installer, run for real: `bcd install-script` prints it, shellcheck reads it, sh
// runs it with --root into a temporary directory, curl and wget fetch the binary from a real HTTPS
// server (openssl s_server), and the end-to-end test joins the dev gateway and starts the installed
// bcd node against it.

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

#include "config/config.h"
#include "daemon/identity/identity.h"
#include "gtest/gtest.h"
#include "install/install_script.h"
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
using install::ShellQuote;

using bcd::testing::Ran;
Ran Sh(const std::string& command) { return bcd::testing::RunShell(command); }

std::string Read(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

unsigned Mode(const std::filesystem::path& path) {
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0) return 0;
  return st.st_mode & 07777;
}

std::string Replace(std::string text, const std::string& from, const std::string& to) {
  for (std::size_t at = text.find(from); at != std::string::npos;
       at = text.find(from, at + to.size())) {
    text.replace(at, from.size(), to);
  }
  return text;
}

const std::string kPin(64, 'a');

class Install : public ::testing::Test {
 protected:
  // One stripped copy of bcd for every test: what a release ships (the build's has debug info).
  static void SetUpTestSuite() {
    binary_dir_ = new FakeRoot();
    binary_ = (binary_dir_->path() / "bcd").string();
    Ran strip = Sh("strip -o " + binary_ + " " + BCD_BINARY);
    ASSERT_EQ(strip.status, 0) << strip.out;
    binary_sha256_ = pki::Hex(pki::Sha256(Read(binary_)));
  }
  static void TearDownTestSuite() { delete binary_dir_; }

  // The installer `bcd install-script FLAGS` prints, saved in the test's directory.
  std::string Generate(const std::vector<std::string>& flags, const std::string& name = "x.sh") {
    std::string command = std::string(BCD_BINARY) + " install-script";
    for (const std::string& flag : flags) command += " " + ShellQuote(flag);
    Ran ran = Sh(command + " > " + (dir_.path() / name).string());
    EXPECT_EQ(ran.status, 0) << ran.out;
    return (dir_.path() / name).string();
  }
  std::vector<std::string> Minimal() const {
    return {"--gateway-url",   "https://gw.example.net:8443",
            "--ca-pin",        kPin,
            "--token",         "bcdjt_x",
            "--binary-url",    "file://" + binary_,
            "--binary-sha256", binary_sha256_};
  }

  static FakeRoot* binary_dir_;
  static std::string binary_;
  static std::string binary_sha256_;
  FakeRoot dir_;
};

FakeRoot* Install::binary_dir_ = nullptr;
std::string Install::binary_;
std::string Install::binary_sha256_;

// Every combination of the flags: shellcheck passes on each installer, and each one, run with
// --root, leaves the files, modes, config and unit it should.
TEST_F(Install, EveryFlagCombinationPassesShellcheckAndInstallsWhatItSays) {
  std::string proxy_ca = dir_.path() / "proxy-ca.pem";
  std::string release_key = dir_.path() / "release.pem";
  DevPki pki = *DevPki::Create(std::time(nullptr));
  dir_.Write("proxy-ca.pem", pki.ServingChainPem());
  std::string release_pem = pki::PrivateKey::Generate()->Public().ToPem();
  dir_.Write("release.pem", release_pem);
  const std::string hex_key(64, 'b');
  struct Case {
    std::string script;
    std::string role, transport, release;
    bool download;
  };
  std::vector<Case> cases;
  int n = 0;
  for (std::string role : {"node", "site"}) {
    for (std::string transport : {"grpc", "websocket", "websocket+proxy-ca"}) {
      for (std::string release : {"none", "hex", "hex+pem"}) {
        for (bool download : {true, false}) {
          std::vector<std::string> flags = {"--ca-pin", kPin, "--token", "bcdjt_combo"};
          if (n % 2 == 0) {
            flags.insert(flags.end(), {"--gateway-url", "https://10.0.0.1:8443",
                                       "--gateway-server-name", "gw.example.net"});
          } else {
            flags.insert(flags.end(), {"--gateway-url", "https://gw.example.net"});
          }
          if (role == "site") flags.insert(flags.end(), {"--role", "site"});
          if (transport != "grpc") {
            flags.insert(flags.end(), {"--websocket-url", "wss://gw.example.net/v1/session"});
          }
          if (transport == "websocket+proxy-ca") {
            flags.insert(flags.end(), {"--proxy-ca-file", proxy_ca});
          }
          if (release != "none") flags.insert(flags.end(), {"--release-key", hex_key});
          if (release == "hex+pem") flags.insert(flags.end(), {"--release-key", release_key});
          if (download) {
            flags.insert(flags.end(),
                         {"--binary-url", "file://" + binary_, "--binary-sha256", binary_sha256_});
          }
          cases.push_back({Generate(flags, "combo-" + std::to_string(n) + ".sh"), role, transport,
                           release, download});
          ++n;
        }
      }
    }
  }
  std::string all;
  for (const Case& c : cases) all += " " + c.script;
  Ran shellcheck = Sh("shellcheck --shell=sh --severity=style" + all);
  EXPECT_EQ(shellcheck.status, 0) << shellcheck.out;
  EXPECT_EQ(shellcheck.out, "");

  for (std::size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    SCOPED_TRACE(c.script + ": " + c.role + ", " + c.transport + ", release keys " + c.release +
                 (c.download ? ", downloaded" : ", preinstalled"));
    std::filesystem::path root = dir_.path() / ("root-" + std::to_string(i));
    if (!c.download) {
      std::filesystem::create_directories(root / "usr/bin");
      std::filesystem::create_symlink(binary_, root / "usr/bin/bcd");
    }
    Ran ran = Sh("sh " + c.script + " --root " + root.string() + " --no-join");
    ASSERT_EQ(ran.status, 0) << ran.out;
    std::string bin = (root / (c.download ? "usr/local/bin/bcd" : "usr/bin/bcd")).string();
    if (c.download) {
      EXPECT_EQ(Read(bin), Read(binary_));
      EXPECT_EQ(Mode(bin), 0755u);
      EXPECT_EQ(Mode(root / "usr/local/bin"), 0755u) << "directories it creates are not 0700";
    } else {
      EXPECT_FALSE(std::filesystem::exists(root / "usr/local/bin/bcd"));
      EXPECT_NE(ran.out.find("using the installed " + bin), std::string::npos) << ran.out;
    }
    EXPECT_EQ(Mode(root / "etc/bcd"), 0700u);
    EXPECT_EQ(Mode(root / "var/lib/bcd"), 0700u);
    std::filesystem::path config_path = root / "etc/bcd/config.toml";
    EXPECT_EQ(Mode(config_path), 0600u);
    absl::StatusOr<Config> config = Config::Load(config_path);
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_EQ(config->GatewayServerName(), "gw.example.net");
    EXPECT_EQ(config->gateway_ca_spki_sha256()->Hex(), kPin);
    EXPECT_EQ(config->state_dir(), root / "var/lib/bcd");
    EXPECT_EQ(config->websocket().has_value(), c.transport != "grpc");
    if (c.transport == "websocket+proxy-ca") {
      ASSERT_TRUE(config->websocket()->proxy_ca_file.has_value());
      EXPECT_EQ(*config->websocket()->proxy_ca_file, root / "etc/bcd/proxy-ca.pem");
      EXPECT_EQ(Read(root / "etc/bcd/proxy-ca.pem"), pki.ServingChainPem());
      EXPECT_EQ(Mode(root / "etc/bcd/proxy-ca.pem"), 0600u);
    }
    std::size_t keys = c.release == "none" ? 0 : c.release == "hex" ? 1 : 2;
    ASSERT_EQ(config->release_keys().size(), keys);
    if (keys == 2) {
      EXPECT_EQ(std::get<Sha256Pin>(config->release_keys()[0]).Hex(), hex_key);
      std::filesystem::path pem = std::get<std::filesystem::path>(config->release_keys()[1]);
      EXPECT_EQ(pem, root / "etc/bcd/release-keys/2.pem");
      EXPECT_EQ(Read(pem), release_pem);
      EXPECT_EQ(Mode(pem), 0600u);
    }
    std::string unit_name = "bcd-" + c.role + ".service";
    std::filesystem::path unit = root / "etc/systemd/system" / unit_name;
    EXPECT_EQ(Mode(unit), 0644u);
    std::string packaged = Read(std::string(BCD_SOURCE_DIR) + "/packaging/" + unit_name);
    EXPECT_EQ(Read(unit), Replace(Replace(packaged, "/usr/bin/bcd", bin), "/etc/bcd/config.toml",
                                  config_path.string()));
    EXPECT_EQ(std::filesystem::read_symlink(root / "etc/systemd/system/multi-user.target.wants" /
                                            unit_name),
              "../" + unit_name);
  }
}

TEST_F(Install, RunningItAgainChangesNothing) {
  std::string script = Generate(Minimal());
  std::string root = (dir_.path() / "root").string();
  Ran first = Sh("sh " + script + " --root " + root + " --no-join");
  ASSERT_EQ(first.status, 0) << first.out;
  EXPECT_NE(first.out.find("wrote " + root + "/etc/bcd/config.toml"), std::string::npos);
  struct stat before {};
  ASSERT_EQ(stat((root + "/etc/bcd/config.toml").c_str(), &before), 0);
  Ran second = Sh("sh " + script + " --root " + root + " --no-join");
  ASSERT_EQ(second.status, 0) << second.out;
  EXPECT_EQ(second.out.find("wrote"), std::string::npos) << second.out;
  for (std::string file :
       {"/usr/local/bin/bcd", "/etc/bcd/config.toml", "/etc/systemd/system/bcd-node.service"}) {
    EXPECT_NE(second.out.find("unchanged: " + root + file), std::string::npos) << second.out;
  }
  struct stat after {};
  ASSERT_EQ(stat((root + "/etc/bcd/config.toml").c_str(), &after), 0);
  EXPECT_EQ(before.st_ino, after.st_ino) << "the config was rewritten";

  // A mode someone loosened is put back; a config edited by hand is replaced by the installer's.
  chmod((root + "/etc/bcd/config.toml").c_str(), 0644);
  chmod((root + "/etc/bcd").c_str(), 0755);
  std::ofstream(root + "/etc/bcd/config.toml", std::ios::app) << "# edited\n";
  Ran third = Sh("sh " + script + " --root " + root + " --no-join");
  ASSERT_EQ(third.status, 0) << third.out;
  EXPECT_NE(third.out.find("wrote " + root + "/etc/bcd/config.toml"), std::string::npos);
  EXPECT_EQ(Mode(root + "/etc/bcd/config.toml"), 0600u);
  EXPECT_EQ(Mode(root + "/etc/bcd"), 0700u);
  EXPECT_EQ(Read(root + "/etc/bcd/config.toml").find("# edited"), std::string::npos);
}

// A node is not turned into a site agent (or back) by running the other role's installer: its
// identity was issued for the role it has.
TEST_F(Install, RefusesToSwitchAMachineToTheOtherRole) {
  std::string node = Generate(Minimal(), "node.sh");
  std::vector<std::string> site_flags = Minimal();
  site_flags.insert(site_flags.end(), {"--role", "site"});
  std::string site = Generate(site_flags, "site.sh");
  std::string root = (dir_.path() / "root").string();
  ASSERT_EQ(Sh("sh " + node + " --root " + root + " --no-join").status, 0);
  std::string config = Read(root + "/etc/bcd/config.toml");
  Ran ran = Sh("sh " + site + " --root " + root + " --no-join");
  EXPECT_EQ(ran.status, 1);
  EXPECT_NE(ran.out.find("bcd-install: error: this machine is installed as a node (" + root +
                         "/etc/systemd/system/bcd-node.service); to make it a site, first remove "
                         "that"),
            std::string::npos)
      << ran.out;
  EXPECT_EQ(Read(root + "/etc/bcd/config.toml"), config);
  EXPECT_FALSE(std::filesystem::exists(root + "/etc/systemd/system/bcd-site.service"));
}

TEST_F(Install, AWrongSha256StopsBeforeAnythingIsWritten) {
  std::vector<std::string> flags = Minimal();
  flags.back() = std::string(64, '0');
  std::string script = Generate(flags);
  std::string root = (dir_.path() / "root").string();
  Ran ran = Sh("sh " + script + " --root " + root);
  EXPECT_EQ(ran.status, 1);
  EXPECT_NE(ran.out.find("bcd-install: error: the download's sha256 is " + binary_sha256_ +
                         ", not " + std::string(64, '0') + ": nothing was installed"),
            std::string::npos)
      << ran.out;
  EXPECT_FALSE(std::filesystem::exists(root)) << "the install wrote something";
}

TEST_F(Install, RefusesAUserOtherThanRoot) {
  std::string script = Generate(Minimal());
  // Piped in, so the unprivileged user needs no access to the test's directory.
  std::string as_user = getuid() == 0 ? "setpriv --reuid=65534 --regid=65534 --clear-groups " : "";
  Ran ran = Sh(as_user + "sh -s < " + script);
  EXPECT_EQ(ran.status, 1);
  EXPECT_NE(ran.out.find("bcd-install: error: run this as root: it installs a system service"),
            std::string::npos)
      << ran.out;
}

// uname is the one thing replaced: this machine cannot be another architecture.
TEST_F(Install, RefusesOtherSystemsAndArchitectures) {
  std::string script = Generate(Minimal());
  std::string root = (dir_.path() / "root").string();
  for (auto [system, machine, message] :
       {std::tuple{"Linux", "riscv64",
                   "bcd runs on x86-64 and arm64 only; this machine is riscv64"},
        std::tuple{"Darwin", "arm64", "bcd runs on Linux only; this machine runs Darwin"}}) {
    dir_.Write("fake-bin/uname", std::string("#!/bin/sh\ncase $1 in -s) echo ") + system +
                                     " ;; -m) echo " + machine + " ;; esac\n");
    chmod((dir_.path() / "fake-bin/uname").c_str(), 0755);
    Ran ran = Sh("PATH=" + (dir_.path() / "fake-bin").string() + ":$PATH sh " + script +
                 " --root " + root);
    EXPECT_EQ(ran.status, 1);
    EXPECT_NE(ran.out.find(std::string("bcd-install: error: ") + message), std::string::npos)
        << ran.out;
    EXPECT_FALSE(std::filesystem::exists(root));
  }
  dir_.Write("fake-bin/uname",
             "#!/bin/sh\ncase $1 in -s) echo Linux ;; -m) echo aarch64 ;; esac\n");
  Ran arm = Sh("PATH=" + (dir_.path() / "fake-bin").string() + ":$PATH sh " + script + " --root " +
               root + " --no-join");
  EXPECT_EQ(arm.status, 0) << arm.out;
}

TEST_F(Install, RefusesBadOptions) {
  std::string script = Generate(Minimal());
  for (auto [args, message] : {
           std::pair{"--frobnicate", "unknown option \"--frobnicate\""},
           std::pair{"--root", "--root needs a directory"},
           std::pair{"--root relative/dir",
                     "--root must be an absolute path, got \"relative/dir\""},
           std::pair{"--root '/tmp/a b'",
                     "--root may hold only letters, digits and . _ / + -, got \"/tmp/a b\""},
           std::pair{"--root '/tmp/$(x)'", "--root may hold only letters"},
       }) {
    Ran ran = Sh("sh " + script + " " + args);
    EXPECT_EQ(ran.status, 1) << args;
    EXPECT_NE(ran.out.find(std::string("bcd-install: error: ") + message), std::string::npos)
        << args << ": " << ran.out;
  }
}

// The download over HTTPS from a real server, with curl and, where curl is missing, with wget; an
// untrusted server's binary is never installed.
TEST_F(Install, DownloadsOverHttpsWithCurlOrWget) {
  FakeRoot www;
  std::filesystem::copy_file(binary_, www.path() / "bcd");
  std::string cert = (dir_.path() / "cert.pem").string();
  std::string key = (dir_.path() / "key.pem").string();
  Ran req =
      Sh("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout " + key +
         " -out " + cert + " -days 1 -subj /CN=127.0.0.1 -addext " + "subjectAltName=IP:127.0.0.1");
  ASSERT_EQ(req.status, 0) << req.out;
  std::string log = (dir_.path() / "s_server.log").string();
  pid_t server = bcd::testing::SpawnChild(
      {"sh", "-c",
       "cd " + www.path().string() + " && exec openssl s_server -accept 127.0.0.1:0 -WWW -cert " +
           cert + " -key " + key + " > " + log + " 2>&1"});
  ASSERT_GT(server, 0);
  std::string port;
  bcd::testing::WaitFor(
      [&] {
        std::string text = Read(log);
        if (std::size_t at = text.find("ACCEPT 127.0.0.1:"); at != std::string::npos) {
          port = text.substr(at + 17, text.find('\n', at) - at - 17);
        }
        return !port.empty();
      },
      std::chrono::seconds(5), std::chrono::milliseconds(50));
  ASSERT_FALSE(port.empty()) << Read(log);
  std::vector<std::string> flags = Minimal();
  flags[flags.size() - 3] = "https://127.0.0.1:" + port + "/bcd";
  std::string script = Generate(flags);
  dir_.Write("wgetrc", "ca_certificate = " + cert + "\n");

  Ran curl = Sh("CURL_CA_BUNDLE=" + cert + " sh " + script + " --root " +
                (dir_.path() / "root-curl").string() + " --no-join");
  EXPECT_EQ(curl.status, 0) << curl.out;
  EXPECT_EQ(Read(dir_.path() / "root-curl/usr/local/bin/bcd"), Read(binary_));

  // A PATH without curl: every other program of /usr/bin and /usr/sbin.
  std::filesystem::path no_curl = dir_.path() / "no-curl";
  std::filesystem::create_directories(no_curl);
  for (std::string bin_dir : {"/usr/bin", "/usr/sbin"}) {
    for (const auto& entry : std::filesystem::directory_iterator(bin_dir)) {
      std::string name = entry.path().filename();
      if (name == "curl" || std::filesystem::exists(no_curl / name)) continue;
      std::filesystem::create_symlink(entry.path(), no_curl / name);
    }
  }
  Ran wget = Sh("WGETRC=" + (dir_.path() / "wgetrc").string() + " PATH=" + no_curl.string() +
                " sh " + script + " --root " + (dir_.path() / "root-wget").string() + " --no-join");
  EXPECT_EQ(wget.status, 0) << wget.out;
  EXPECT_EQ(Read(dir_.path() / "root-wget/usr/local/bin/bcd"), Read(binary_));

  // wget, like curl, refuses a server it has no reason to trust.
  Ran wget_untrusted = Sh("WGETRC=/dev/null PATH=" + no_curl.string() + " sh " + script +
                          " --root " + (dir_.path() / "root-wget-untrusted").string());
  EXPECT_EQ(wget_untrusted.status, 1) << wget_untrusted.out;
  EXPECT_NE(wget_untrusted.out.find(
                "bcd-install: error: could not download https://127.0.0.1:" + port + "/bcd"),
            std::string::npos)
      << wget_untrusted.out;
  EXPECT_FALSE(std::filesystem::exists(dir_.path() / "root-wget-untrusted"));

  std::filesystem::remove(no_curl / "wget");
  Ran neither = Sh("PATH=" + no_curl.string() + " sh " + script + " --root " +
                   (dir_.path() / "root-neither").string());
  EXPECT_EQ(neither.status, 1);
  EXPECT_NE(neither.out.find("neither curl nor wget is installed"), std::string::npos)
      << neither.out;

  Ran untrusted = Sh("sh " + script + " --root " + (dir_.path() / "root-untrusted").string());
  EXPECT_EQ(untrusted.status, 1);
  EXPECT_NE(untrusted.out.find("bcd-install: error: could not download https://127.0.0.1:" + port +
                               "/bcd"),
            std::string::npos)
      << untrusted.out;
  EXPECT_FALSE(std::filesystem::exists(dir_.path() / "root-untrusted"));
  kill(server, SIGTERM);
  bcd::testing::WaitChild(server);
}

// End to end: the installer joins the dev gateway with a token full of shell and TOML syntax (the
// join succeeding proves it arrived byte for byte), and the installed bcd node connects.
TEST_F(Install, JoinsTheDevGatewayAndTheInstalledNodeConnects) {
  unsetenv("https_proxy");
  unsetenv("HTTPS_PROXY");
  DevPki pki = *DevPki::Create(std::time(nullptr));
  std::unique_ptr<DevGateway> gateway = *DevGateway::Start(pki, {});
  std::string canary = (dir_.path() / "injected").string();
  std::string token = "bcdjt_'\"$(touch " + canary + ")`touch " + canary + "`;touch " + canary +
                      " \\\" ${x} %s\\n' ]";
  gateway->AddJoinToken("installed-1", 3600, token);
  std::vector<std::string> flags = Minimal();
  flags[1] = "https://127.0.0.1:" + std::to_string(gateway->port());
  flags[3] = pki.ServingCaPinHex();
  flags[5] = token;
  flags.insert(flags.end(), {"--gateway-server-name", DevPki::kGatewayName});
  std::string script = Generate(flags);
  std::filesystem::path root = dir_.path() / "root";
  Ran ran = Sh("sh " + script + " --root " + root.string());
  ASSERT_EQ(ran.status, 0) << ran.out;
  EXPECT_FALSE(std::filesystem::exists(canary)) << "the token ran as shell";
  EXPECT_EQ(ran.out.find(token), std::string::npos) << "the token was printed";
  EXPECT_NE(ran.out.find("joined as spiffe://dev.test/site/dev/node/installed-1"),
            std::string::npos)
      << ran.out;
  EXPECT_EQ(gateway->joins_granted(), 1);
  EXPECT_EQ(Mode(root / "var/lib/bcd/identity.pem"), 0600u);

  // The installed binary, with the installed config, as the unit would start it.
  std::string bin = (root / "usr/local/bin/bcd").string();
  pid_t node =
      bcd::testing::SpawnChild({bin, "node", "--config", (root / "etc/bcd/config.toml").string()});
  ASSERT_GT(node, 0);
  EXPECT_TRUE(gateway->WaitForWelcomes(1, std::chrono::seconds(30)));
  EXPECT_EQ(gateway->SessionNodes(), std::vector<std::string>{"installed-1"});
  kill(node, SIGTERM);
  EXPECT_EQ(bcd::testing::WaitChild(node), 0);

  // Again: nothing changes and the node is not joined a second time.
  int calls = gateway->join_calls();
  Ran again = Sh("sh " + script + " --root " + root.string());
  ASSERT_EQ(again.status, 0) << again.out;
  EXPECT_NE(again.out.find("already joined (an identity is in " + root.string() +
                           "/var/lib/bcd): not joining again"),
            std::string::npos)
      << again.out;
  EXPECT_EQ(gateway->join_calls(), calls);
}

// The system install itself, as root without --root: in a private mount namespace where /etc,
// /usr/local, /var/lib and /run are overlays (what it writes stays in the test's directory), with
// a systemctl first on PATH that records its calls (systemd does not run here).
TEST_F(Install, AsRootItInstallsIntoTheSystemEnablesJoinsAndStarts) {
  if (getuid() != 0) GTEST_SKIP() << "needs root (a mount namespace with overlays)";
  std::filesystem::path t = dir_.path();
  std::filesystem::create_directories(t / "probe/upper");
  std::filesystem::create_directories(t / "probe/work");
  std::string probe =
      "unshare --mount --propagation private mount -t overlay overlay -o "
      "lowerdir=/etc,upperdir=" +
      (t / "probe/upper").string() + ",workdir=" + (t / "probe/work").string() + " /etc";
  if (Ran ran = Sh(probe); ran.status != 0) {
    GTEST_SKIP() << "no mount namespace with an overlay here: " << ran.out;
  }
  unsetenv("https_proxy");
  unsetenv("HTTPS_PROXY");
  DevPki pki = *DevPki::Create(std::time(nullptr));
  std::unique_ptr<DevGateway> gateway = *DevGateway::Start(pki, {});
  std::vector<std::string> flags = Minimal();
  flags[1] = "https://127.0.0.1:" + std::to_string(gateway->port());
  flags[3] = pki.ServingCaPinHex();
  flags[5] = gateway->AddJoinToken("system-1");
  flags.insert(flags.end(), {"--gateway-server-name", DevPki::kGatewayName});
  std::string script = Generate(flags);
  dir_.Write("bin/systemctl",
             "#!/bin/sh\necho \"$*\" >> " + (t / "systemctl.calls").string() + "\n");
  chmod((t / "bin/systemctl").c_str(), 0755);
  std::string mounts;
  for (std::string dir : {"/etc", "/usr/local", "/var/lib", "/run"}) {
    std::string name = dir.substr(1);
    std::replace(name.begin(), name.end(), '/', '-');
    std::filesystem::create_directories(t / "upper" / name);
    std::filesystem::create_directories(t / "work" / name);
    mounts += "mount -t overlay overlay -o lowerdir=" + dir +
              ",upperdir=" + (t / "upper" / name).string() +
              ",workdir=" + (t / "work" / name).string() + " " + dir + "; ";
  }
  std::string out = (t / "out").string();
  std::string run = "PATH=" + (t / "bin").string() + ":$PATH sh " + script;
  std::string inside =
      // Nothing runs unless every overlay is in place: under `set -e`, each mount is a statement.
      "set -e; " + mounts +
      "mkdir -p /run/systemd/system; rm -rf /etc/bcd /var/lib/bcd /usr/local/bin/bcd "
      "/etc/systemd/system/bcd-node.service; " +
      "if " + run + " > " + out + "-1 2>&1; then echo 0; else echo $?; fi > " + out + "-1.rc; " +
      "if " + run + " > " + out + "-2 2>&1; then echo 0; else echo $?; fi > " + out + "-2.rc; " +
      "R=" + (t / "result").string() +
      "; mkdir $R; cp -a /etc/bcd $R/etc-bcd; cp -a /var/lib/bcd $R/var-lib-bcd; " +
      "cp -a /usr/local/bin/bcd $R/bin-bcd; cp -a /etc/systemd/system/bcd-node.service $R/";
  Ran ran = Sh("unshare --mount --propagation private sh -c " + ShellQuote(inside));
  ASSERT_EQ(ran.status, 0) << ran.out;
  std::string first = Read(out + "-1");
  ASSERT_EQ(Read(out + "-1.rc"), "0\n") << first;
  EXPECT_NE(first.find("wrote /usr/local/bin/bcd"), std::string::npos) << first;
  EXPECT_NE(first.find("wrote /etc/bcd/config.toml"), std::string::npos) << first;
  EXPECT_NE(first.find("wrote /etc/systemd/system/bcd-node.service"), std::string::npos) << first;
  EXPECT_NE(first.find("joined as spiffe://dev.test/site/dev/node/system-1"), std::string::npos);
  EXPECT_NE(first.find("started bcd-node.service"), std::string::npos) << first;
  std::string second = Read(out + "-2");
  ASSERT_EQ(Read(out + "-2.rc"), "0\n") << second;
  EXPECT_EQ(second.find("wrote"), std::string::npos) << second;
  EXPECT_NE(second.find("already joined"), std::string::npos) << second;
  EXPECT_NE(second.find("bcd-node.service is running"), std::string::npos) << second;
  // Reload and enable each time; restart after the first install, a plain start after the
  // second (nothing changed).
  EXPECT_EQ(Read(t / "systemctl.calls"),
            "daemon-reload\nenable --quiet bcd-node.service\nrestart bcd-node.service\n"
            "daemon-reload\nenable --quiet bcd-node.service\nstart bcd-node.service\n");
  EXPECT_EQ(gateway->joins_granted(), 1);

  std::filesystem::path result = t / "result";
  EXPECT_EQ(Mode(result / "etc-bcd"), 0700u);
  EXPECT_EQ(Mode(result / "etc-bcd/config.toml"), 0600u);
  EXPECT_EQ(Mode(result / "var-lib-bcd"), 0700u);
  EXPECT_EQ(Mode(result / "var-lib-bcd/identity.pem"), 0600u);
  EXPECT_EQ(Mode(result / "bin-bcd"), 0755u);
  absl::StatusOr<Config> config = Config::Load(result / "etc-bcd/config.toml");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->state_dir(), "/var/lib/bcd");
  EXPECT_EQ(Mode(result / "bcd-node.service"), 0644u);
  std::string packaged = Read(std::string(BCD_SOURCE_DIR) + "/packaging/bcd-node.service");
  EXPECT_EQ(Read(result / "bcd-node.service"),
            Replace(packaged, "/usr/bin/bcd", "/usr/local/bin/bcd"));
  EXPECT_EQ(Read(result / "bin-bcd"), Read(binary_));
  EXPECT_FALSE(std::filesystem::exists("/etc/bcd/config.toml") &&
               Read("/etc/bcd/config.toml") == Read(result / "etc-bcd/config.toml"))
      << "the install escaped the namespace";
}

TEST_F(Install, ARefusedJoinStopsTheInstallWithAClearMessage) {
  DevPki pki = *DevPki::Create(std::time(nullptr));
  std::unique_ptr<DevGateway> gateway = *DevGateway::Start(pki, {});
  std::vector<std::string> flags = Minimal();
  flags[1] = "https://localhost:" + std::to_string(gateway->port());
  flags[3] = pki.ServingCaPinHex();
  flags[5] = "bcdjt_never-issued";
  std::string script = Generate(flags);
  std::filesystem::path root = dir_.path() / "root";
  Ran ran = Sh("sh " + script + " --root " + root.string());
  EXPECT_EQ(ran.status, 1);
  EXPECT_NE(ran.out.find("bcd-install: error: the gateway refused the join"), std::string::npos)
      << ran.out;
  EXPECT_FALSE(std::filesystem::exists(root / "var/lib/bcd/identity.pem"));
}

}  // namespace
}  // namespace bcd
