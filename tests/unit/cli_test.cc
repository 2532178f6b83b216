#include "app/cli.h"

#include <sstream>

#include "base/version.h"
#include "bettercompute/common/v1/common.pb.h"
#include "fmt/format.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/unit/fake_root.h"

namespace bcd {
namespace {

using bcd::testing::FakeRoot;

struct Result {
  int code;
  std::string out;
  std::string err;
};

Result RunBcd(std::vector<std::string> args, const std::filesystem::path& root = "/nonexistent",
              const std::filesystem::path& default_config = "/nonexistent/config.toml") {
  std::ostringstream out, err;
  CliEnv env{.out = out,
             .err = err,
             .root = root,
             .architecture = "x86_64",
             .runner = nullptr,
             .now = [] { return uint64_t{1700000000}; },
             .default_config = default_config};
  int code = RunCli(args, env);
  return {code, out.str(), err.str()};
}

TEST(Cli, VersionPrintsVersionProtocolRangeAndCapabilities) {
  Result r = RunBcd({"version"});
  EXPECT_EQ(r.code, kExitOk);
  EXPECT_EQ(r.out, std::string("bcd ") + std::string(Version()) +
                       "\nprotocol 1..1\n"
                       "capabilities (node): tunnel.shell, tunnel.exec, tunnel.tcp, secrets.jwe, "
                       "spec.daemon, spec.access, tunnel.instance-dial, workload-token\n"
                       "capabilities (site): tunnel.shell, tunnel.exec, tunnel.tcp, secrets.jwe, "
                       "spec.daemon, spec.access\n"
                       "capabilities (ramdisk): tunnel.shell, tunnel.exec, tunnel.tcp, "
                       "secrets.jwe, spec.daemon, spec.access\n");
  EXPECT_EQ(r.err, "");
}

TEST(Cli, VersionJsonHasStableFields) {
  Result r = RunBcd({"version", "--json"});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  nlohmann::json doc = nlohmann::json::parse(r.out);
  EXPECT_EQ(doc["version"], Version());
  EXPECT_EQ(doc["protocol"]["min"], 1);
  EXPECT_EQ(doc["protocol"]["max"], 1);
  EXPECT_EQ(doc["transport"], "grpc");
  EXPECT_EQ(doc["capabilities"]["site"],
            nlohmann::json::array({"tunnel.shell", "tunnel.exec", "tunnel.tcp", "secrets.jwe",
                                   "spec.daemon", "spec.access"}));
  EXPECT_TRUE(doc["capabilities"]["node"].is_array());
  EXPECT_TRUE(doc["capabilities"]["ramdisk"].is_array());
  EXPECT_EQ(RunBcd({"--version"}).out, std::string("bcd ") + std::string(Version()) + "\n");
  EXPECT_EQ(RunBcd({"version", "--jsn"}).code, kExitUsage);
}

TEST(Cli, StatusJsonWithoutADaemonSaysWhatTheStateDirHolds) {
  FakeRoot dir;
  dir.Write("config.toml", "gateway_url = \"https://gw.example.net\"\ngateway_ca_spki_sha256 = \"" +
                               std::string(64, 'a') + "\"\nstate_dir = \"" +
                               (dir.path() / "state").string() + "\"\n");
  std::string config = (dir.path() / "config.toml").string();
  Result r = RunBcd({"status", "--json", "--config", config});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  nlohmann::json doc = nlohmann::json::parse(r.out);
  EXPECT_EQ(doc["node"]["joined"], false);
  EXPECT_EQ(doc["daemon"]["running"], false);
  EXPECT_EQ(doc["daemon"]["socket"], (dir.path() / "state" / "bcd.sock").string());
  EXPECT_TRUE(doc["session"].is_null());
  EXPECT_EQ(doc["state_dir"], (dir.path() / "state").string());
  Result text = RunBcd({"status", "--config", config});
  EXPECT_EQ(text.out, fmt::format("version: {}\nnode: not joined (no identity in {})\nsession: not "
                                  "running (no daemon answers on {})\n",
                                  Version(), (dir.path() / "state").string(),
                                  (dir.path() / "state" / "bcd.sock").string()));
}

TEST(Cli, VersionSaysAWebSocketConfigAdvertisesNoTunnels) {
  FakeRoot dir;
  dir.Write("config.toml",
            "gateway_url = \"https://gw.example.net\"\n"
            "gateway_ca_spki_sha256 = \"" +
                std::string(64, 'a') +
                "\"\n"
                "[websocket]\nurl = \"wss://gw.example.net/v1/session\"\n");
  Result r = RunBcd({"version", "--config", (dir.path() / "config.toml").string()});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  EXPECT_NE(r.out.find("capabilities (node): secrets.jwe, spec.daemon, spec.access, "
                       "workload-token (no tunnels: they need the gRPC transport)\n"),
            std::string::npos)
      << r.out;
}

TEST(Cli, InventoryPrintsTheClaimsOfTheRootAsJson) {
  FakeRoot root;
  root.PopulateServer();
  Result r = RunBcd({"inventory"}, root.path());
  EXPECT_EQ(r.code, kExitOk) << r.err;
  bettercompute::common::v1::HardwareClaims claims;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(r.out, &claims).ok()) << r.out;
  EXPECT_EQ(claims.hostname(), "gpu-node-7");
  EXPECT_EQ(claims.cpu().architecture(), "x86_64");
  EXPECT_EQ(claims.collected_at(), 1700000000u);
  EXPECT_EQ(claims.gpus_size(), 1);
}

TEST(Cli, NoArgumentsIsAUsageError) {
  Result r = RunBcd({});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_NE(r.err.find("Usage: bcd COMMAND"), std::string::npos);
}

TEST(Cli, HelpListsEveryCommand) {
  Result r = RunBcd({"--help"});
  EXPECT_EQ(r.code, kExitOk);
  for (const char* name :
       {"join", "node", "site", "ramdisk", "status", "inventory", "install-script", "version"}) {
    EXPECT_NE(r.out.find(std::string("  ") + name + " "), std::string::npos) << name;
  }
}

TEST(Cli, UnknownCommandIsAUsageError) {
  Result r = RunBcd({"frobnicate"});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_EQ(r.err, "bcd: unknown command \"frobnicate\" (see bcd --help)\n");
}

TEST(Cli, UnknownOptionIsAUsageError) {
  Result r = RunBcd({"version", "--verbose"});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_EQ(r.err, "bcd version: unknown option \"--verbose\"\n");
}

TEST(Cli, ConfigWithoutAPathIsAUsageError) {
  EXPECT_EQ(RunBcd({"inventory", "--config"}).err, "bcd inventory: --config needs a path\n");
  EXPECT_EQ(RunBcd({"inventory", "--config="}).code, kExitUsage);
}

TEST(Cli, RamdiskRunsItsModeAndRefusesBadOptionsAndAnUnjoinedMachine) {
  Result bad = RunBcd({"ramdisk", "--token", "T"});
  EXPECT_EQ(bad.code, kExitUsage);
  EXPECT_EQ(bad.err, "bcd ramdisk: unknown option \"--token\"\n");
  FakeRoot dir;
  dir.Write("config.toml",
            "gateway_url = \"https://gw.example.net\"\n"
            "gateway_ca_spki_sha256 = \"" +
                std::string(64, 'a') + "\"\nstate_dir = \"" + (dir.path() / "state").string() +
                "\"\n");
  Result unjoined = RunBcd({"ramdisk", "--config", (dir.path() / "config.toml").string()});
  EXPECT_EQ(unjoined.code, kExitOther);
  EXPECT_NE(unjoined.err.find("bcd ramdisk: this node has not joined"), std::string::npos)
      << unjoined.err;
  EXPECT_EQ(unjoined.out, "");
}

TEST(Cli, InstallScriptPrintsTheInstallerOrNamesTheBadFlag) {
  Result bad = RunBcd({"install-script", "--token", "T"});
  EXPECT_EQ(bad.code, kExitUsage);
  EXPECT_EQ(bad.err, "bcd install-script: --gateway-url is required\n");
  EXPECT_EQ(bad.out, "");
  Result good = RunBcd({"install-script", "--gateway-url", "https://gw.example.net", "--ca-pin",
                        std::string(64, 'a'), "--token", "T"});
  EXPECT_EQ(good.code, kExitOk) << good.err;
  EXPECT_TRUE(good.out.starts_with("#!/bin/sh\n")) << good.out;
  EXPECT_EQ(good.err, "");
}

TEST(Cli, EveryCommandTakesConfigAndHelp) {
  for (const char* name :
       {"join", "node", "site", "ramdisk", "status", "inventory", "install-script", "version"}) {
    Result r = RunBcd({name, "--config", "/x.toml", "--help"});
    EXPECT_EQ(r.code, kExitOk) << name;
    EXPECT_NE(r.out.find(std::string("usage: bcd ") + name + " [--config PATH]"),
              std::string::npos);
  }
}

TEST(Cli, AnExplicitConfigMustLoad) {
  Result r = RunBcd({"version", "--config", "/nonexistent/bcd.toml"});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_EQ(r.err,
            "bcd: bad config:\n/nonexistent/bcd.toml: cannot read the config file: No such file or "
            "directory\n");
}

TEST(Cli, ABadConfigNamesFileLineAndKey) {
  FakeRoot dir;
  dir.Write("bcd.toml", "gateway_url = \"https://gw.test\"\ngateway_ca_spki_sha256 = \"abc\"\n");
  std::string path = (dir.path() / "bcd.toml").string();
  Result r = RunBcd({"inventory", "--config=" + path});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_EQ(r.err, "bcd: bad config:\n" + path +
                       ":2: gateway_ca_spki_sha256: expected 64 hex characters (a sha256), got 3 "
                       "characters\n");
}

TEST(Cli, TheDefaultConfigIsReadWhenItExists) {
  FakeRoot dir;
  dir.Write("config.toml", "bogus = 1\n");
  Result r = RunBcd({"version"}, "/nonexistent", dir.path() / "config.toml");
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_NE(r.err.find(":1: bogus: unknown key"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace bcd
