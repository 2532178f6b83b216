#include "config/config.h"

#include <fstream>

#include "gtest/gtest.h"
#include "proto/absl_compat.h"

namespace bcd {
namespace {

const std::string kPin(64, 'a');

std::string Valid() {
  return "gateway_url = \"https://gw.eu-1.example.net:443\"\n"
         "gateway_ca_spki_sha256 = \"" +
         kPin + "\"\n";
}

// The error Parse gives for `text` (named "c.toml"); "" when it parses.
std::string ErrorOf(const std::string& text) {
  absl::StatusOr<Config> config = Config::Parse(text, "c.toml");
  if (config.ok()) return "";
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(ToStd(config.status().message()));
}

TEST(Config, ParsesTheFullExample) {
  std::string text =
      "gateway_url = \"https://gw.eu-1.example.net:443\"\n"
      "gateway_server_name = \"gw.eu-1.example.net\"\n"
      "gateway_ca_spki_sha256 = \"" +
      std::string(64, 'A') +
      "\"\n"
      "join_service_key_sha256 = \"" +
      std::string(64, '0') +
      "\"\n"
      "state_dir = \"/var/lib/bcd\"\n"
      "log_level = \"debug\"\n"
      "[websocket]\n"
      "url = \"wss://gw.eu-1.example.net/v1/session\"\n"
      "proxy_ca_file = \"/etc/bcd/proxy-ca.pem\"\n"
      "[update]\n"
      "release_keys = [\"" +
      std::string(64, 'b') +
      "\", \"/etc/bcd/release.pem\"]\n"
      "[imds]\n"
      "listen = \"169.254.169.254:80\"\n"
      "[tunnels]\n"
      "max = 8\n";
  absl::StatusOr<Config> config = Config::Parse(text, "c.toml");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->gateway_url()->host(), "gw.eu-1.example.net");
  EXPECT_EQ(config->gateway_url()->port(), 443);
  EXPECT_EQ(config->GatewayServerName(), "gw.eu-1.example.net");
  EXPECT_EQ(config->gateway_ca_spki_sha256()->Hex(), kPin);
  EXPECT_EQ(config->join_service_key_sha256()->Hex(), std::string(64, '0'));
  EXPECT_EQ(config->state_dir(), "/var/lib/bcd");
  EXPECT_EQ(config->log_level(), LogLevel::kDebug);
  ASSERT_TRUE(config->websocket());
  EXPECT_EQ(config->websocket()->url.path(), "/v1/session");
  EXPECT_EQ(config->websocket()->url.port(), 443);
  EXPECT_EQ(*config->websocket()->proxy_ca_file, "/etc/bcd/proxy-ca.pem");
  ASSERT_EQ(config->release_keys().size(), 2u);
  EXPECT_EQ(std::get<Sha256Pin>(config->release_keys()[0]).Hex(), std::string(64, 'b'));
  EXPECT_EQ(std::get<std::filesystem::path>(config->release_keys()[1]), "/etc/bcd/release.pem");
  EXPECT_EQ(config->imds_listen()->host, "169.254.169.254");
  EXPECT_EQ(config->imds_listen()->port, 80);
  EXPECT_EQ(config->max_tunnels(), 8u);
  EXPECT_EQ(config->source(), "c.toml");
}

TEST(Config, MinimalConfigTakesDefaults) {
  absl::StatusOr<Config> config = Config::Parse(Valid(), "c.toml");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->state_dir(), "/var/lib/bcd");
  EXPECT_EQ(config->log_level(), LogLevel::kInfo);
  EXPECT_EQ(config->max_tunnels(), 16u);
  EXPECT_FALSE(config->websocket());
  EXPECT_FALSE(config->join_service_key_sha256());
  EXPECT_FALSE(config->imds_listen());
  EXPECT_FALSE(config->diag_listen()) << "diagnostics are off unless configured";
  EXPECT_EQ(config->log_format(), LogFormat::kLogfmt);
  EXPECT_TRUE(config->release_keys().empty());
}

TEST(Config, DiagAndLogFormat) {
  absl::StatusOr<Config> config = Config::Parse(
      Valid() + "log_format = \"json\"\n[diag]\nlisten = \"127.0.0.1:9464\"\n", "c.toml");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->log_format(), LogFormat::kJson);
  EXPECT_EQ(config->diag_listen()->host, "127.0.0.1");
  EXPECT_EQ(config->diag_listen()->port, 9464);
  config = Config::Parse(Valid() + "[diag]\nlisten = \"[::1]:0\"\n", "c.toml");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->diag_listen()->host, "::1");
  EXPECT_EQ(config->diag_listen()->port, 0) << "any free port, logged when taken";
  config = Config::Parse(Valid() + "[diag]\nlisten = \"10.0.0.5:9464\"\nallow_remote = true\n",
                         "c.toml");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->diag_listen()->host, "10.0.0.5");
}

TEST(Config, UpdateLimits) {
  absl::StatusOr<Config> config = Config::Parse(Valid(), "c.toml");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->update().trial_seconds, 120);
  EXPECT_EQ(config->update().max_bytes, int64_t{512} << 20);
  EXPECT_EQ(config->update().keep_free_bytes, int64_t{64} << 20);
  config = Config::Parse(
      Valid() + "[update]\ntrial_seconds = 30\nmax_bytes = 1048576\nkeep_free_bytes = 0\n",
      "c.toml");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->update().trial_seconds, 30);
  EXPECT_EQ(config->update().max_bytes, 1048576);
  EXPECT_EQ(config->update().keep_free_bytes, 0);
}

TEST(ConfigErrors, UpdateLimits) {
  EXPECT_EQ(ErrorOf(Valid() + "[update]\ntrial_seconds = 1\n"),
            "c.toml:4: update.trial_seconds: expected 5 to 3600, got 1");
  EXPECT_EQ(ErrorOf(Valid() + "[update]\nmax_bytes = \"big\"\n"),
            "c.toml:4: update.max_bytes: expected an integer, got string");
}

TEST(Config, SiteBmcs) {
  absl::StatusOr<Config> config = Config::Parse(Valid(), "c.toml");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->site().bmc_ca_file, "");
  EXPECT_TRUE(config->site().bmc_tls_unverified.empty());
  EXPECT_EQ(config->site().bmc_redfish_port, 443);
  EXPECT_EQ(config->site().bmc_ipmi_port, 623);
  config = Config::Parse(Valid() +
                             "[site]\nbmc_ca_file = \"/etc/bcd/bmc-ca.pem\"\n"
                             "bmc_tls_unverified = [\"10.0.0.7\", \"bmc-3.site\"]\n"
                             "bmc_redfish_port = 8443\nbmc_ipmi_port = 6230\n",
                         "c.toml");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->site().bmc_ca_file, "/etc/bcd/bmc-ca.pem");
  EXPECT_EQ(config->site().bmc_tls_unverified,
            (std::vector<std::string>{"10.0.0.7", "bmc-3.site"}));
  EXPECT_EQ(config->site().bmc_redfish_port, 8443);
  EXPECT_EQ(config->site().bmc_ipmi_port, 6230);
  EXPECT_TRUE(config->site().http_proxy_allow.empty());
  config = Config::Parse(Valid() +
                             "[site]\nhttp_proxy_allow = [\"10.20.0.0/16:*\", \"[fd00::/8]:443\"]\n"
                             "http_proxy_ca_file = \"/etc/bcd/site-ca.pem\"\n",
                         "c.toml");
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_EQ(config->site().http_proxy_allow.size(), 2u);
  EXPECT_EQ(config->site().http_proxy_allow[1].port, 443);
  EXPECT_EQ(config->site().http_proxy_ca_file, "/etc/bcd/site-ca.pem");
}

TEST(ConfigErrors, SiteBmcs) {
  EXPECT_EQ(ErrorOf(Valid() + "[site]\nbmc_ca_file = \"ca.pem\"\n"),
            "c.toml:4: site.bmc_ca_file: expected an absolute path, got \"ca.pem\"");
  EXPECT_EQ(ErrorOf(Valid() + "[site]\nbmc_tls_unverified = \"10.0.0.7\"\n"),
            "c.toml:4: site.bmc_tls_unverified: expected an array of BMC addresses, got string");
  EXPECT_EQ(ErrorOf(Valid() + "[site]\nbmc_tls_unverified = [\"a b\"]\n"),
            "c.toml:4: site.bmc_tls_unverified[0]: expected a BMC address, got \"a b\"");
  EXPECT_EQ(ErrorOf(Valid() + "[site]\nbmc_ipmi_port = 0\n"),
            "c.toml:4: site.bmc_ipmi_port: expected 1 to 65535, got 0");
  EXPECT_EQ(ErrorOf(Valid() + "[site]\nhttp_proxy_allow = [\"switch.site:443\"]\n"),
            "c.toml:4: site.http_proxy_allow[0]: expected an IP or CIDR block and a port: a name "
            "is decided by the addresses it resolves to, got \"switch.site:443\"");
  EXPECT_EQ(ErrorOf(Valid() + "[site]\nhttp_proxy_allow = [\"10.0.0.0/8\"]\n"),
            "c.toml:4: site.http_proxy_allow[0]: expected HOST:PORT (PORT a number or *), got "
            "\"10.0.0.0/8\"");
  EXPECT_EQ(ErrorOf(Valid() + "[site]\nbmc_redfish = 1\n"),
            "c.toml:4: site.bmc_redfish: unknown key");
}

TEST(Config, BootServer) {
  absl::StatusOr<Config> config = Config::Parse(Valid(), "c.toml");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_FALSE(config->boot());
  config = Config::Parse(Valid() + "[boot]\nlisten = \"10.20.0.5:8080\"\n", "c.toml");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->boot()->listen.port, 8080);
  EXPECT_EQ(config->boot()->url, "http://10.20.0.5:8080");
  config = Config::Parse(Valid() + "[boot]\nlisten = \"[fd00::5]:80\"\n", "c.toml");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->boot()->url, "http://[fd00::5]:80");
  config = Config::Parse(
      Valid() + "[boot]\nlisten = \"0.0.0.0:8080\"\nurl = \"http://boot.site-1.example:8080/\"\n",
      "c.toml");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->boot()->listen.host, "0.0.0.0");
  EXPECT_EQ(config->boot()->url, "http://boot.site-1.example:8080");
}

TEST(ConfigErrors, BootServer) {
  EXPECT_EQ(ErrorOf(Valid() + "[boot]\nlisten = \"0.0.0.0:8080\"\n"),
            "c.toml:3: boot.url: required when listen is a wildcard address: the address booting "
            "machines reach the boot server at, like \"http://10.20.0.5:8080\"");
  EXPECT_EQ(ErrorOf(Valid() + "[boot]\nurl = \"http://10.0.0.1:80\"\n"),
            "c.toml:3: boot.listen: required key is missing: the [boot] section needs a listen");
  EXPECT_NE(ErrorOf(Valid() + "[boot]\nlisten = \"10.0.0.1:80\"\nurl = \"https://10.0.0.1\"\n")
                .find("c.toml:5: boot.url"),
            std::string::npos);
  EXPECT_EQ(ErrorOf(Valid() + "[boot]\nlisten = \"10.0.0.1:80\"\nurl = \"http://10.0.0.1/x\"\n"),
            "c.toml:5: boot.url: a path is not allowed in the boot URL, got \"http://10.0.0.1/x\"");
  EXPECT_EQ(ErrorOf(Valid() + "[boot]\nlisten = \"10.0.0.1:80\"\nport = 1\n"),
            "c.toml:5: boot.port: unknown key");
}

TEST(ConfigErrors, DiagAndLogFormat) {
  EXPECT_EQ(ErrorOf(Valid() + "[diag]\nlisten = \"0.0.0.0:9464\"\n"),
            "c.toml:4: diag.listen: 0.0.0.0 is not a loopback address: set allow_remote = true "
            "to serve /metrics, /healthz and /readyz beyond this machine");
  EXPECT_EQ(ErrorOf(Valid() + "[diag]\nallow_remote = true\n"),
            "c.toml:3: diag.listen: required key is missing: the [diag] section needs a listen");
  EXPECT_EQ(ErrorOf(Valid() + "[diag]\nlisten = \"localhost:9464\"\n"),
            "c.toml:4: diag.listen: expected IP:PORT (an IPv4 address or a bracketed IPv6 "
            "address, and a port from 1 to 65535), got \"localhost:9464\"");
  EXPECT_EQ(ErrorOf(Valid() + "[diag]\nlisten = \"127.0.0.1:1\"\nallow_remote = \"yes\"\n"),
            "c.toml:5: diag.allow_remote: expected true or false, got string");
  EXPECT_EQ(ErrorOf(Valid() + "log_format = \"text\"\n"),
            "c.toml:3: log_format: expected logfmt or json, got \"text\"");
}

TEST(Config, EmbeddedDefaultHasNoGateway) {
  Config config = Config::EmbeddedDefault();
  EXPECT_FALSE(config.gateway_url());
  EXPECT_EQ(config.state_dir(), "/var/lib/bcd");
  EXPECT_EQ(config.source(), "(embedded default)");
}

TEST(Config, IpGatewayUsesTheServerName) {
  absl::StatusOr<Config> config = Config::Parse(
      "gateway_url = \"https://127.0.0.1:8443\"\ngateway_server_name = \"gw.test\"\n"
      "gateway_ca_spki_sha256 = \"" +
          kPin + "\"\n",
      "c.toml");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->gateway_url()->host_is_ip());
  EXPECT_EQ(config->gateway_url()->port(), 8443);
  EXPECT_EQ(config->GatewayServerName(), "gw.test");
}

TEST(Config, Ipv6Gateway) {
  absl::StatusOr<Config> config = Config::Parse(
      "gateway_url = \"https://[::1]:9000\"\ngateway_server_name = \"gw.test\"\n"
      "gateway_ca_spki_sha256 = \"" +
          kPin + "\"\n",
      "c.toml");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->gateway_url()->host(), "::1");
  EXPECT_EQ(config->gateway_url()->port(), 9000);
}

TEST(ConfigErrors, UnknownTopLevelKey) {
  EXPECT_EQ(ErrorOf(Valid() + "gateway = 1\n"), "c.toml:3: gateway: unknown key");
}

TEST(ConfigErrors, UnknownKeyInASection) {
  EXPECT_EQ(ErrorOf(Valid() + "[websocket]\nurl = \"wss://gw.test/v1/session\"\nurll = \"x\"\n"),
            "c.toml:5: websocket.urll: unknown key");
  EXPECT_EQ(ErrorOf(Valid() + "[tunnels]\nmax = 2\nmin = 1\n"),
            "c.toml:5: tunnels.min: unknown key");
}

TEST(ConfigErrors, UnknownSection) {
  EXPECT_EQ(ErrorOf(Valid() + "[proxy]\nurl = \"x\"\n"), "c.toml:3: proxy: unknown key");
}

TEST(ConfigErrors, WrongTypes) {
  EXPECT_EQ(ErrorOf("gateway_url = 443\ngateway_ca_spki_sha256 = \"" + kPin + "\"\n"),
            "c.toml:1: gateway_url: expected a string, got integer");
  EXPECT_EQ(ErrorOf(Valid() + "log_level = true\n"),
            "c.toml:3: log_level: expected a string, got boolean");
  EXPECT_EQ(ErrorOf(Valid() + "websocket = \"wss://x\"\n"),
            "c.toml:3: websocket: expected a table, got string");
  EXPECT_EQ(ErrorOf(Valid() + "[tunnels]\nmax = \"16\"\n"),
            "c.toml:4: tunnels.max: expected an integer, got string");
  EXPECT_EQ(ErrorOf(Valid() + "[tunnels]\nmax = 1.5\n"),
            "c.toml:4: tunnels.max: expected an integer, got float");
  EXPECT_EQ(ErrorOf(Valid() + "[update]\nrelease_keys = \"" + kPin + "\"\n"),
            "c.toml:4: update.release_keys: expected an array of strings, got string");
  EXPECT_EQ(ErrorOf(Valid() + "[update]\nrelease_keys = [1]\n"),
            "c.toml:4: update.release_keys[0]: expected a string, got integer");
  EXPECT_EQ(ErrorOf(Valid() + "state_dir = 2020-01-01\n"),
            "c.toml:3: state_dir: expected a string, got date");
}

TEST(ConfigErrors, BadGatewayUrls) {
  auto with_url = [](const std::string& url) {
    return ErrorOf("gateway_url = \"" + url + "\"\ngateway_ca_spki_sha256 = \"" + kPin + "\"\n");
  };
  EXPECT_EQ(with_url("http://gw.test"),
            "c.toml:1: gateway_url: expected a URL with scheme https://, got \"http://gw.test\"");
  EXPECT_EQ(with_url("gw.test:443"),
            "c.toml:1: gateway_url: expected a URL with scheme https://, got \"gw.test:443\"");
  EXPECT_EQ(with_url("https://user:pw@gw.test"),
            "c.toml:1: gateway_url: user info is not allowed in the URL, got "
            "\"https://user:pw@gw.test\"");
  EXPECT_EQ(with_url("https://gw.test:0"),
            "c.toml:1: gateway_url: the URL's port is not a number from 1 to 65535, got "
            "\"https://gw.test:0\"");
  EXPECT_EQ(with_url("https://gw.test:65536"),
            "c.toml:1: gateway_url: the URL's port is not a number from 1 to 65535, got "
            "\"https://gw.test:65536\"");
  EXPECT_EQ(with_url("https://gw.test:"),
            "c.toml:1: gateway_url: the URL's port is not a number from 1 to 65535, got "
            "\"https://gw.test:\"");
  EXPECT_EQ(with_url("https://gw.test/?a=b"),
            "c.toml:1: gateway_url: a query or fragment is not allowed in the URL, got "
            "\"https://gw.test/?a=b\"");
  EXPECT_EQ(with_url("https://gw_x.test"),
            "c.toml:1: gateway_url: the URL's host is not a DNS name or IP address, got "
            "\"https://gw_x.test\"");
  EXPECT_EQ(with_url("https://300.1.1.1"),
            "c.toml:1: gateway_url: the URL's host is not a DNS name or IP address, got "
            "\"https://300.1.1.1\"");
  EXPECT_EQ(with_url("https://[::g]:1"),
            "c.toml:1: gateway_url: the URL's bracketed host is not an IPv6 address, got "
            "\"https://[::g]:1\"");
  EXPECT_EQ(with_url("https://gw.test/v1"),
            "c.toml:1: gateway_url: a path is not allowed in the gateway URL, got "
            "\"https://gw.test/v1\"");
  EXPECT_EQ(
      with_url("https://"),
      "c.toml:1: gateway_url: the URL's host is not a DNS name or IP address, got \"https://\"");
  EXPECT_EQ(with_url("https://gw test"),
            "c.toml:1: gateway_url: the URL has a space or a non-ASCII character, got \"https://gw "
            "test\"");
}

TEST(ConfigErrors, IpGatewayWithoutServerName) {
  EXPECT_EQ(
      ErrorOf("gateway_url = \"https://10.0.0.1\"\ngateway_ca_spki_sha256 = \"" + kPin + "\"\n"),
      "c.toml:1: gateway_server_name: required when gateway_url names an IP address: the "
      "name the gateway certificate must carry");
}

TEST(ConfigErrors, BadServerName) {
  EXPECT_EQ(ErrorOf(Valid() + "gateway_server_name = \"-gw.test\"\n"),
            "c.toml:3: gateway_server_name: expected a DNS name, got \"-gw.test\"");
}

TEST(ConfigErrors, PinsThatAreNot64Hex) {
  EXPECT_EQ(
      ErrorOf("gateway_url = \"https://gw.test\"\ngateway_ca_spki_sha256 = \"" +
              std::string(63, 'a') + "\"\n"),
      "c.toml:2: gateway_ca_spki_sha256: expected 64 hex characters (a sha256), got 63 characters");
  EXPECT_EQ(
      ErrorOf(Valid() + "join_service_key_sha256 = \"" + std::string(62, 'a') + "zz\"\n"),
      "c.toml:3: join_service_key_sha256: expected 64 hex characters (a sha256), found \"zz\" "
      "at position 62");
  EXPECT_EQ(
      ErrorOf(Valid() + "join_service_key_sha256 = \"" + std::string(62, 'a') + "+1\"\n"),
      "c.toml:3: join_service_key_sha256: expected 64 hex characters (a sha256), found \"+1\" "
      "at position 62");
}

TEST(ConfigErrors, MissingRequiredKeys) {
  EXPECT_EQ(ErrorOf(""),
            "c.toml: gateway_url: required key is missing\n"
            "c.toml: gateway_ca_spki_sha256: required key is missing");
  EXPECT_EQ(
      ErrorOf(Valid() + "[websocket]\nproxy_ca_file = \"/x.pem\"\n"),
      "c.toml:3: websocket.url: required key is missing: the [websocket] section needs a url");
}

TEST(ConfigErrors, BadValues) {
  EXPECT_EQ(ErrorOf(Valid() + "state_dir = \"var/lib/bcd\"\n"),
            "c.toml:3: state_dir: expected an absolute path, got \"var/lib/bcd\"");
  EXPECT_EQ(ErrorOf(Valid() + "log_level = \"verbose\"\n"),
            "c.toml:3: log_level: expected one of debug, info, warn, error, got \"verbose\"");
  EXPECT_EQ(ErrorOf(Valid() + "[websocket]\nurl = \"https://gw.test/v1/session\"\n"),
            "c.toml:4: websocket.url: expected a URL with scheme wss://, got "
            "\"https://gw.test/v1/session\"");
  EXPECT_EQ(ErrorOf(Valid() + "[websocket]\nurl = \"wss://gw.test\"\nproxy_ca_file = \"ca.pem\"\n"),
            "c.toml:5: websocket.proxy_ca_file: expected an absolute path, got \"ca.pem\"");
  EXPECT_EQ(ErrorOf(Valid() + "[update]\nrelease_keys = [\"release.pem\"]\n"),
            "c.toml:4: update.release_keys[0]: expected an SPKI sha256 (64 hex characters) or an "
            "absolute path to a PEM file, got \"release.pem\"");
  EXPECT_EQ(ErrorOf(Valid() + "[imds]\nlisten = \"169.254.169.254\"\n"),
            "c.toml:4: imds.listen: expected IP:PORT (an IPv4 address or a bracketed IPv6 address, "
            "and a port from 1 to 65535), got \"169.254.169.254\"");
  EXPECT_EQ(ErrorOf(Valid() + "[imds]\nlisten = \"metadata:80\"\n"),
            "c.toml:4: imds.listen: expected IP:PORT (an IPv4 address or a bracketed IPv6 address, "
            "and a port from 1 to 65535), got \"metadata:80\"");
  EXPECT_EQ(ErrorOf(Valid() + "[tunnels]\nmax = 0\n"),
            "c.toml:4: tunnels.max: expected 1 to 16, got 0");
  EXPECT_EQ(ErrorOf(Valid() + "[tunnels]\nmax = 17\n"),
            "c.toml:4: tunnels.max: expected 1 to 16, got 17");
}

TEST(ConfigErrors, ReportsEveryErrorAtOnce) {
  EXPECT_EQ(ErrorOf(Valid() + "log_level = \"loud\"\nfoo = 1\n[tunnels]\nmax = 99\n"),
            "c.toml:3: log_level: expected one of debug, info, warn, error, got \"loud\"\n"
            "c.toml:4: foo: unknown key\n"
            "c.toml:6: tunnels.max: expected 1 to 16, got 99");
}

TEST(Config, NodeSection) {
  absl::StatusOr<Config> defaults = Config::Parse(Valid(), "c.toml");
  EXPECT_EQ(defaults->reboot_command(), (std::vector<std::string>{"systemctl", "reboot"}));
  EXPECT_EQ(defaults->log_unit(), "bcd.service");
  absl::StatusOr<Config> config = Config::Parse(
      Valid() +
          "[node]\nreboot_command = [\"/bin/touch\", \"/tmp/x\"]\nlog_unit = \"bcd@a.service\"\n",
      "c.toml");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->reboot_command(), (std::vector<std::string>{"/bin/touch", "/tmp/x"}));
  EXPECT_EQ(config->log_unit(), "bcd@a.service");
  EXPECT_EQ(ErrorOf(Valid() + "[node]\nreboot_command = []\n"),
            "c.toml:4: node.reboot_command: expected a non-empty array of strings (the program "
            "and its arguments), got an empty array");
  EXPECT_EQ(ErrorOf(Valid() + "[node]\nreboot_command = [\"a\", 1]\n"),
            "c.toml:4: node.reboot_command[1]: expected a string, got integer");
  EXPECT_EQ(ErrorOf(Valid() + "[node]\nlog_unit = \"-a b\"\n"),
            "c.toml:4: node.log_unit: expected a systemd unit name, got \"-a b\"");
}

TEST(ConfigErrors, InvalidToml) {
  EXPECT_EQ(ErrorOf("gateway_url = \n"),
            "c.toml:1:15: invalid TOML: Error while parsing key-value pair: expected value, saw "
            "'\\n'");
  EXPECT_EQ(ErrorOf(Valid() + "log_level = \"info\"\nlog_level = \"warn\"\n"),
            "c.toml:4:13: invalid TOML: Error while parsing key-value pair: cannot redefine "
            "existing string 'log_level'");
}

TEST(ConfigLoad, NamesAMissingFile) {
  absl::StatusOr<Config> config = Config::Load("/nonexistent/bcd.toml");
  EXPECT_EQ(config.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ToStd(config.status().message()),
            "/nonexistent/bcd.toml: cannot read the config file: No such file or directory");
}

TEST(ConfigLoad, ErrorsNameTheFilePath) {
  std::filesystem::path path = std::filesystem::path(::testing::TempDir()) / "bcd-config-test.toml";
  std::ofstream(path) << Valid() << "bogus = 1\n";
  absl::StatusOr<Config> config = Config::Load(path);
  EXPECT_EQ(ToStd(config.status().message()), path.string() + ":3: bogus: unknown key");
  std::filesystem::remove(path);
}

TEST(ConfigLoad, RefusesAFileOverOneMebibyte) {
  std::filesystem::path path = std::filesystem::path(::testing::TempDir()) / "bcd-config-big.toml";
  std::ofstream(path) << Valid() << "# " << std::string(1 << 20, 'x') << "\n";
  absl::StatusOr<Config> config = Config::Load(path);
  EXPECT_EQ(ToStd(config.status().message()),
            path.string() + ": the config file is larger than 1048576 bytes");
  std::filesystem::remove(path);
}

TEST(ConfigLoad, ReadsADirectoryAsAnError) {
  absl::StatusOr<Config> config = Config::Load("/");
  EXPECT_EQ(config.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ToStd(config.status().message()), "/: cannot read the config file: Is a directory");
}

TEST(Config, TunnelsUserAndAllowList) {
  absl::StatusOr<Config> config =
      Config::Parse(Valid() +
                        "[tunnels]\nuser = \"ops\"\n"
                        "allow = [\"10.0.0.0/8:22\", \"[fd00::/8]:*\", \"DB.internal:5432\"]\n",
                    "c.toml");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->tunnel_user(), "ops");
  const auto& allow = config->tunnel_allow();
  ASSERT_EQ(allow.size(), 3u);
  EXPECT_TRUE(allow[0].Allows("10.1.2.3", "10.1.2.3", 22));
  EXPECT_FALSE(allow[0].Allows("10.1.2.3", "10.1.2.3", 23));
  EXPECT_FALSE(allow[0].Allows("11.0.0.1", "11.0.0.1", 22));
  EXPECT_TRUE(allow[1].Allows("fd00::5", "fd00::5", 9000));
  EXPECT_TRUE(allow[2].Allows("db.INTERNAL", "10.9.9.9", 5432));
  EXPECT_FALSE(allow[2].Allows("db.internal.evil", "10.9.9.9", 5432));
}

TEST(Config, TunnelsAllowLoopbackByDefault) {
  Config config = *Config::Parse(Valid(), "c.toml");
  EXPECT_TRUE(config.tunnel_user().empty());
  bool loopback = false, elsewhere = false;
  for (const auto& rule : config.tunnel_allow()) {
    loopback |= rule.Allows("127.0.0.1", "127.0.0.1", 8080);
    elsewhere |= rule.Allows("192.0.2.1", "192.0.2.1", 22);
  }
  EXPECT_TRUE(loopback);
  EXPECT_FALSE(elsewhere);
  // By address only: a name (localhost included) is allowed by what it resolves to, never by how
  // it is spelled.
  for (const auto& rule : config.tunnel_allow()) {
    EXPECT_FALSE(rule.Allows("localhost", "192.0.2.1", 22));
    EXPECT_FALSE(rule.Allows("127.0.0.1.evil.example", "192.0.2.1", 22));
  }
}

TEST(ConfigErrors, TunnelsUserAndAllowList) {
  EXPECT_EQ(ErrorOf(Valid() + "[tunnels]\nuser = \"-rf\"\n"),
            "c.toml:4: tunnels.user: expected a user name, got \"-rf\"");
  EXPECT_EQ(ErrorOf(Valid() + "[tunnels]\nallow = \"127.0.0.1:22\"\n"),
            "c.toml:4: tunnels.allow: expected an array of \"HOST:PORT\" strings, got string");
  EXPECT_EQ(ErrorOf(Valid() + "[tunnels]\nallow = [\"127.0.0.1\"]\n"),
            "c.toml:4: tunnels.allow[0]: expected HOST:PORT (PORT a number or *), got "
            "\"127.0.0.1\"");
  EXPECT_EQ(ErrorOf(Valid() + "[tunnels]\nallow = [\"10.0.0.0/40:22\"]\n"),
            "c.toml:4: tunnels.allow[0]: \"10.0.0.0/40:22\": a bad CIDR block");
  EXPECT_EQ(ErrorOf(Valid() + "[tunnels]\nallow = [\"a b:22\"]\n"),
            "c.toml:4: tunnels.allow[0]: \"a b:22\": HOST must be an IP, a CIDR block or a host "
            "name");
}

}  // namespace
}  // namespace bcd
