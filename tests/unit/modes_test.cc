// The list of modes and what each asks of the engine: the role it joins and says Hello with, and
// the config tables it reads (a table nobody reads is reported at start).

#include "app/modes.h"

#include "config/config.h"
#include "gtest/gtest.h"

namespace bcd {
namespace {

namespace common = bettercompute::common::v1;

Config Parsed(const std::string& tables) {
  absl::StatusOr<Config> config = Config::Parse(
      "gateway_url = \"https://gw.example.net\"\n"
      "gateway_ca_spki_sha256 = \"" +
          std::string(64, 'a') + "\"\n" + tables,
      "c.toml");
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

TEST(Modes, EachModeJoinsWithItsOwnRole) {
  EXPECT_EQ(MakeMode(proto::Mode::kNode)->role(), common::ROLE_NODE);
  EXPECT_EQ(MakeMode(proto::Mode::kSite)->role(), common::ROLE_SITE);
  EXPECT_EQ(MakeMode(proto::Mode::kRamdisk)->role(), common::ROLE_RAMDISK);
  for (proto::Mode mode : kModes) EXPECT_EQ(MakeMode(mode)->id(), mode);
}

TEST(Modes, TheConfigRecordsItsTablesInFileOrder) {
  Config config = Parsed("[tunnels]\nmax = 2\n[imds]\nlisten = \"127.0.0.1:8080\"\n[node]\n");
  EXPECT_EQ(config.sections(), (std::vector<std::string>{"tunnels", "imds", "node"}));
  EXPECT_TRUE(Parsed("").sections().empty());
}

TEST(Modes, ATableOnlyAnotherModeReadsIsReported) {
  Config config = Parsed("[imds]\nlisten = \"127.0.0.1:8080\"\n[node]\nlog_unit = \"b.service\"\n");
  EXPECT_TRUE(UnreadConfigSections(config, *MakeMode(proto::Mode::kNode)).empty());
  EXPECT_EQ(UnreadConfigSections(config, *MakeMode(proto::Mode::kSite)),
            std::vector<std::string>{"imds"});
  EXPECT_EQ(UnreadConfigSections(config, *MakeMode(proto::Mode::kRamdisk)),
            std::vector<std::string>{"imds"});
}

TEST(Modes, TheEngineTablesAreReadInEveryMode) {
  Config config = Parsed(
      "[websocket]\nurl = \"wss://gw.example.net/v1/session\"\n[update]\n[tunnels]\nmax = 1\n"
      "[diag]\nlisten = \"127.0.0.1:9464\"\n");
  for (proto::Mode mode : kModes) {
    EXPECT_TRUE(UnreadConfigSections(config, *MakeMode(mode)).empty()) << proto::ModeName(mode);
  }
}

}  // namespace
}  // namespace bcd
