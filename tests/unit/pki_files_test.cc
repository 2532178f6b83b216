#include <sys/stat.h>

#include <fstream>

#include "base/files.h"
#include "gtest/gtest.h"
#include "pki/files.h"
#include "pki/keys.h"
#include "proto/absl_compat.h"

namespace bcd::pki {
namespace {

namespace fs = std::filesystem;

std::string Message(const absl::Status& status) { return std::string(ToStd(status.message())); }

class Files : public ::testing::Test {
 protected:
  Files() {
    std::string pattern = (fs::path(::testing::TempDir()) / "bcd-files-XXXXXX").string();
    dir_ = mkdtemp(pattern.data());
  }
  ~Files() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(Files, AtomicWriteReplacesTheFileWithTheGivenMode) {
  fs::path path = dir_ / "state";
  ASSERT_TRUE(AtomicWriteFile(path, "one", 0644).ok());
  ASSERT_TRUE(AtomicWriteFile(path, "two", 0600).ok());
  EXPECT_EQ(*ReadWholeFile(path, 100), "two");
  EXPECT_EQ(fs::status(path).permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1)
      << "no temp file left";
}

TEST_F(Files, AFailedWriteLeavesNothingBehind) {
  absl::Status status = AtomicWriteFile(dir_ / "missing-dir" / "state", "x", 0600);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 0);
}

TEST_F(Files, ReadIsBounded) {
  ASSERT_TRUE(AtomicWriteFile(dir_ / "big", std::string(101, 'x'), 0600).ok());
  EXPECT_EQ(Message(ReadWholeFile(dir_ / "big", 100).status()),
            (dir_ / "big").string() + " is larger than 100 bytes");
  EXPECT_EQ(ReadWholeFile(dir_ / "none", 100).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(Files, StoresKeys0600AndLoadsThem) {
  PrivateKey key = *PrivateKey::Generate();
  fs::path path = dir_ / "node.key";
  ASSERT_TRUE(StorePrivateKey(path, key).ok());
  EXPECT_EQ(fs::status(path).permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write);
  EXPECT_EQ(LoadPrivateKey(path)->Public().SpkiDer(), key.Public().SpkiDer());
}

TEST_F(Files, RefusesAKeyFileOthersCanRead) {
  fs::path path = dir_ / "node.key";
  ASSERT_TRUE(StorePrivateKey(path, *PrivateKey::Generate()).ok());
  chmod(path.c_str(), 0644);
  absl::StatusOr<PrivateKey> key = LoadPrivateKey(path);
  EXPECT_EQ(key.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Message(key.status()),
            "key file " + path.string() +
                " has mode 0644: group and others must have no access (chmod 600)");
}

TEST_F(Files, ACorruptKeyFileIsNamed) {
  fs::path path = dir_ / "node.key";
  ASSERT_TRUE(AtomicWriteFile(path, "not a key", 0600).ok());
  EXPECT_EQ(LoadPrivateKey(path).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(Message(LoadPrivateKey(path).status()).substr(0, path.string().size() + 9),
            "key file " + path.string());
}

}  // namespace
}  // namespace bcd::pki
