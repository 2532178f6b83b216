#pragma once

// Where the independent fixtures live. The committed ones by default; the interop test points these
// at freshly made ones (BCD_PKI_CERTS, BCD_PKI_NODE_FIXTURES).

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace bcd::testing {

inline std::string ReadFixture(const std::filesystem::path& path) {
  std::ifstream file(path, std::ios::binary);
  EXPECT_TRUE(file) << "cannot read fixture " << path;
  std::stringstream bytes;
  bytes << file.rdbuf();
  return bytes.str();
}

inline std::filesystem::path CertsDir() {
  const char* dir = std::getenv("BCD_PKI_CERTS");
  return dir ? dir : std::filesystem::path(BCD_SOURCE_DIR) / "tests/fixtures/pki/certs";
}

inline std::string Cert(const std::string& name) { return ReadFixture(CertsDir() / name); }

inline const nlohmann::json& NodeFixtures() {
  static const nlohmann::json* fixtures = [] {
    const char* file = std::getenv("BCD_PKI_NODE_FIXTURES");
    std::filesystem::path path =
        file ? file
             : std::filesystem::path(BCD_SOURCE_DIR) / "tests/fixtures/pki/node-fixtures.json";
    return new nlohmann::json(nlohmann::json::parse(ReadFixture(path)));
  }();
  return *fixtures;
}

// The clock the Node fixtures were made at.
inline constexpr int64_t kFixtureNow = 1800000000;

inline std::string FromHex(const std::string& hex) {
  std::string out;
  for (std::size_t i = 0; i + 1 < hex.size(); i += 2) {
    out += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  }
  return out;
}

}  // namespace bcd::testing
