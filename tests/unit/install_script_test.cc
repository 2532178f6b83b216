#include "install/install_script.h"

#include <sys/wait.h>

#include <cstdio>
#include <map>

#include "gtest/gtest.h"
#include "pki/keys.h"

namespace bcd::install {
namespace {

const std::string kPin(64, 'A');

absl::StatusOr<std::string> ReadFrom(const std::map<std::string, std::string>& files,
                                     const std::string& path) {
  auto it = files.find(path);
  if (it == files.end()) return absl::NotFoundError("no such file");
  return it->second;
}

absl::StatusOr<InstallOptions> Parse(std::vector<std::string> args,
                                     const std::map<std::string, std::string>& files = {}) {
  return ParseInstallFlags(args, [&](const std::string& path) { return ReadFrom(files, path); });
}

std::vector<std::string> Base() {
  return {"--gateway-url", "https://gw.example.net", "--ca-pin", kPin, "--token", "t"};
}

std::vector<std::string> With(std::vector<std::string> more) {
  std::vector<std::string> args = Base();
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

TEST(InstallFlags, TheMinimalFlagsMakeANodeInstaller) {
  absl::StatusOr<InstallOptions> o = Parse(Base());
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->role, "node");
  EXPECT_EQ(o->ca_pin, std::string(64, 'a')) << "pins are stored lower-case";
  EXPECT_FALSE(o->binary_url.has_value());
  absl::StatusOr<std::string> script = GenerateInstallScript(*o);
  ASSERT_TRUE(script.ok()) << script.status();
  EXPECT_TRUE(script->starts_with("#!/bin/sh\n"));
  EXPECT_NE(script->find("role='node'\n"), std::string::npos);
  EXPECT_NE(script->find("ExecStart=/usr/bin/bcd node --config /etc/bcd/config.toml"),
            std::string::npos);
}

TEST(InstallFlags, EqualsFormsAndRepeatedReleaseKeys) {
  absl::StatusOr<InstallOptions> o =
      Parse(With({"--role=site", "--release-key=" + std::string(64, 'c'), "--release-key",
                  std::string(64, 'D')}));
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->role, "site");
  EXPECT_EQ(o->release_keys,
            (std::vector<std::string>{std::string(64, 'c'), std::string(64, 'd')}));
}

TEST(InstallFlags, EveryBadFlagIsRefusedByName) {
  std::string pem = pki::PrivateKey::Generate()->Public().ToPem();
  std::map<std::string, std::string> files = {{"/key.pem", pem}, {"/junk", "not pem"}};
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {{"--ca-pin", kPin, "--token", "t"}, "--gateway-url is required"},
           {{"--gateway-url", "https://gw", "--token", "t"}, "--ca-pin is required"},
           {{"--gateway-url", "https://gw", "--ca-pin", kPin}, "--token is required"},
           {With({"--frob", "x"}), "unknown option \"--frob\""},
           {With({"--role"}), "--role needs a value"},
           {With({"--role", "ramdisk"}), "--role must be node or site, got \"ramdisk\""},
           {With({"--token", "u"}), "--token is given twice"},
           {{"--gateway-url", "http://gw", "--ca-pin", kPin, "--token", "t"}, "--gateway-url: "},
           {{"--gateway-url", "https://10.0.0.1", "--ca-pin", kPin, "--token", "t"},
            "--gateway-server-name is required when --gateway-url names an IP address"},
           {{"--gateway-url", "https://gw", "--ca-pin", "abc", "--token", "t"}, "--ca-pin: "},
           {{"--gateway-url", "https://gw", "--ca-pin", kPin, "--token", ""},
            "--token must be 1 to 8192 bytes long"},
           {{"--gateway-url", "https://gw", "--ca-pin", kPin, "--token", "a\nb"},
            "--token holds a control character"},
           {With({"--websocket-url", "https://gw/v1/session"}), "--websocket-url: "},
           {With({"--proxy-ca-file", "/key.pem"}), "--proxy-ca-file needs --websocket-url"},
           {With({"--websocket-url", "wss://gw/v1/session", "--proxy-ca-file", "/missing"}),
            "--proxy-ca-file /missing: no such file"},
           {With({"--websocket-url", "wss://gw/v1/session", "--proxy-ca-file", "/junk"}),
            "--proxy-ca-file /junk: expected PEM certificates"},
           {With({"--release-key", "/missing"}),
            "--release-key /missing: neither an SPKI sha256 (64 hex characters) nor a readable "
            "file"},
           {With({"--release-key", "/junk"}), "--release-key /junk: expected a PEM public key"},
           {With({"--binary-url", "https://r.example.net/bcd"}),
            "--binary-url and --binary-sha256 go together"},
           {With({"--binary-sha256", kPin}), "--binary-url and --binary-sha256 go together"},
           {With({"--binary-url", "http://r.example.net/bcd", "--binary-sha256", kPin}),
            "--binary-url: "},
           {With({"--binary-url", "https://r.example.net/bcd", "--binary-sha256", "xyz"}),
            "--binary-sha256: "},
           {With({"--gateway-server-name", "not a name"}),
            "the config it would write is invalid: config.toml:3: gateway_server_name"},
       }) {
    absl::StatusOr<InstallOptions> o = Parse(c.args, files);
    absl::Status status = o.ok() ? GenerateInstallScript(*o).status() : o.status();
    EXPECT_FALSE(status.ok()) << c.message;
    EXPECT_NE(std::string(status.message()).find(c.message), std::string::npos)
        << "want: " << c.message << "\ngot: " << status.message();
  }
  EXPECT_TRUE(Parse(With({"--release-key", "/key.pem"}), files).ok());
}

TEST(InstallFlags, APemReleaseKeyIsEmbeddedReencoded) {
  std::string pem = pki::PrivateKey::Generate()->Public().ToPem();
  absl::StatusOr<InstallOptions> o =
      Parse(With({"--release-key", "/key.pem"}), {{"/key.pem", "junk before\n" + pem}});
  ASSERT_TRUE(o.ok()) << o.status();
  ASSERT_EQ(o->release_keys.size(), 1u);
  EXPECT_EQ(o->release_keys[0], pem);
}

// ShellQuote against a real sh: every value comes back byte for byte, nothing runs.
TEST(ShellQuote, ARealShellReadsTheValueBackUnchanged) {
  for (std::string value :
       {std::string(""), std::string("plain"), std::string("it's"), std::string("'''"),
        std::string("$(echo pwned) `echo pwned` ${HOME} \"q\" \\ ; | & < > * ? ~ #"),
        std::string("line\nbreak\ttab"), std::string("\xc3\xa9t\xc3\xa9")}) {
    FILE* pipe = popen(("printf %s " + ShellQuote(value)).c_str(), "r");
    std::string out;
    char buffer[256];
    while (std::size_t n = std::fread(buffer, 1, sizeof buffer, pipe)) out.append(buffer, n);
    EXPECT_EQ(WEXITSTATUS(pclose(pipe)), 0);
    EXPECT_EQ(out, value);
  }
}

}  // namespace
}  // namespace bcd::install
