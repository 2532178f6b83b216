#include "daemon/delivery/outbox.h"

#include <fstream>

#include "fmt/format.h"
#include "gtest/gtest.h"
#include "pki/keys.h"
#include "proto/absl_compat.h"
#include "proto/signing_input.h"
#include "tests/unit/fake_root.h"

namespace bcd {
namespace {

namespace v1 = bettercompute::agent::v1;
using bcd::testing::FakeRoot;

std::string Message(const absl::Status& status) { return std::string(ToStd(status.message())); }

v1::AgentFrame Event(const std::string& kind) {
  v1::AgentFrame frame;
  frame.mutable_event()->set_kind(kind);
  return frame;
}

std::vector<std::string> Kinds(const Outbox& outbox) {
  std::vector<std::string> kinds;
  for (const auto& frame : outbox.pending()) kinds.push_back(frame.event().kind());
  return kinds;
}

// Flips one byte of the file at `at`.
void FlipByte(const std::filesystem::path& path, uint64_t at) {
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  file.seekg(static_cast<std::streamoff>(at));
  char c = 0;
  file.get(c);
  file.seekp(static_cast<std::streamoff>(at));
  file.put(static_cast<char>(c ^ 0x10));
}

// Writes a log of `records` at `path` and returns where each starts.
std::vector<uint64_t> WriteLog(const std::filesystem::path& path,
                               const std::vector<std::string>& records) {
  std::vector<std::string> read;
  std::vector<uint64_t> offsets;
  {
    RecordLog log = *RecordLog::Open(path, &read);
    for (const std::string& record : records) EXPECT_TRUE(log.Append(record).ok());
  }
  read.clear();
  RecordLog reopened = *RecordLog::Open(path, &read, &offsets);
  EXPECT_EQ(read, records);
  return offsets;
}

TEST(RecordLog, KeepsRecordsAcrossReopen) {
  FakeRoot dir;
  std::vector<std::string> records;
  {
    RecordLog log = *RecordLog::Open(dir.path() / "log", &records);
    ASSERT_TRUE(log.Append("one").ok());
    ASSERT_TRUE(log.Append("").ok());
    ASSERT_TRUE(log.Append("three").ok());
  }
  RecordLog log = *RecordLog::Open(dir.path() / "log", &records);
  EXPECT_EQ(records, (std::vector<std::string>{"one", "", "three"}));
}

TEST(RecordLog, CutsATornLastRecordAndKeepsAppending) {
  FakeRoot dir;
  std::vector<std::string> records;
  {
    RecordLog log = *RecordLog::Open(dir.path() / "log", &records);
    ASSERT_TRUE(log.Append("kept").ok());
    ASSERT_TRUE(log.Append("torn away").ok());
  }
  std::filesystem::resize_file(dir.path() / "log",
                               std::filesystem::file_size(dir.path() / "log") - 3);
  {
    RecordLog log = *RecordLog::Open(dir.path() / "log", &records);
    EXPECT_EQ(records, std::vector<std::string>{"kept"});
    ASSERT_TRUE(log.Append("after").ok());
  }
  records.clear();
  RecordLog log = *RecordLog::Open(dir.path() / "log", &records);
  EXPECT_EQ(records, (std::vector<std::string>{"kept", "after"}));
}

TEST(RecordLog, DamageBeforeTheEndIsDataLossNamingTheOffset) {
  FakeRoot dir;
  std::vector<std::string> records;
  {
    RecordLog log = *RecordLog::Open(dir.path() / "log", &records);
    ASSERT_TRUE(log.Append("first").ok());
    ASSERT_TRUE(log.Append("second").ok());
  }
  std::vector<uint64_t> offsets;
  { RecordLog log = *RecordLog::Open(dir.path() / "log", &records, &offsets); }
  FlipByte(dir.path() / "log", offsets[0] + RecordLog::kHeaderBytes + 1);  // inside "first"
  absl::StatusOr<RecordLog> log = RecordLog::Open(dir.path() / "log", &records);
  EXPECT_EQ(log.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(Message(log.status()), fmt::format("{}: damaged record at byte {}",
                                               (dir.path() / "log").string(), offsets[0]));
}

TEST(RecordLog, ADamagedLengthThatRunsPastTheEndIsDataLossNotATornTail) {
  FakeRoot dir;
  std::filesystem::path path = dir.path() / "log";
  std::vector<uint64_t> offsets = WriteLog(path, {"first", "second"});
  auto size = std::filesystem::file_size(path);
  FlipByte(path, offsets[0] + 1);  // the first record's length now runs far past the end
  std::vector<std::string> records;
  absl::StatusOr<RecordLog> log = RecordLog::Open(path, &records);
  EXPECT_EQ(log.status().code(), absl::StatusCode::kDataLoss) << "records read: " << records.size();
  EXPECT_EQ(Message(log.status()),
            fmt::format("{}: damaged record header at byte {}", path.string(), offsets[0]));
  EXPECT_EQ(std::filesystem::file_size(path), size) << "nothing was cut";
}

TEST(RecordLog, ADamagedLastHeaderIsDataLossButAHeaderCutShortIsATornTail) {
  FakeRoot dir;
  std::filesystem::path path = dir.path() / "log";
  std::vector<uint64_t> offsets = WriteLog(path, {"first", "last one"});
  FlipByte(path, offsets[1] + 3);  // the last record's length, one bit off
  std::vector<std::string> records;
  EXPECT_EQ(RecordLog::Open(path, &records).status().code(), absl::StatusCode::kDataLoss);
  FlipByte(path, offsets[1] + 3);                      // mended
  std::filesystem::resize_file(path, offsets[1] + 5);  // the crash came inside the header
  records.clear();
  ASSERT_TRUE(RecordLog::Open(path, &records).ok());
  EXPECT_EQ(records, std::vector<std::string>{"first"});
  EXPECT_EQ(std::filesystem::file_size(path), offsets[1]);
}

TEST(RecordLog, ATailOfZerosIsTornButZerosBeforeARecordAreDamage) {
  FakeRoot dir;
  std::filesystem::path path = dir.path() / "log";
  WriteLog(path, {"first"});
  auto size = std::filesystem::file_size(path);
  // A machine crash can leave the file longer than the data that reached the disk: zeros.
  std::filesystem::resize_file(path, size + 40);
  std::vector<std::string> records;
  ASSERT_TRUE(RecordLog::Open(path, &records).ok());
  EXPECT_EQ(records, std::vector<std::string>{"first"});
  EXPECT_EQ(std::filesystem::file_size(path), size);
  // Zeros where a record starts, with a record after them, are damage.
  std::vector<uint64_t> offsets = WriteLog(dir.path() / "two", {"first", "second"});
  {
    std::fstream file(dir.path() / "two", std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(static_cast<std::streamoff>(offsets[0]));
    file.write(std::string(RecordLog::kHeaderBytes, '\0').data(), RecordLog::kHeaderBytes);
  }
  records.clear();
  EXPECT_EQ(RecordLog::Open(dir.path() / "two", &records).status().code(),
            absl::StatusCode::kDataLoss);
}

TEST(RecordLog, ALogOfTheEarlierFramingIsReadOnceAndRewritten) {
  FakeRoot dir;
  std::filesystem::path path = dir.path() / "log";
  // Before the magic: uint32_be(length) || first 4 bytes of SHA-256(record) || record.
  std::string old;
  for (std::string record : {"one", "two"}) {
    old += proto::Uint32Be(static_cast<uint32_t>(record.size())) +
           pki::Sha256(record).substr(0, 4) + record;
  }
  dir.Write("log", old);
  std::vector<std::string> records;
  {
    RecordLog log = *RecordLog::Open(path, &records);
    ASSERT_TRUE(log.Append("three").ok());
  }
  EXPECT_EQ(records, (std::vector<std::string>{"one", "two"}));
  records.clear();
  ASSERT_TRUE(RecordLog::Open(path, &records).ok());
  EXPECT_EQ(records, (std::vector<std::string>{"one", "two", "three"}));
  std::ifstream in(path, std::ios::binary);
  std::string head(RecordLog::kMagic.size(), '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  EXPECT_EQ(head, RecordLog::kMagic);
}

TEST(RecordLog, AFileOfAnotherFormatIsRefusedNotEmptied) {
  FakeRoot dir;
  std::filesystem::path path = dir.path() / "log";
  std::ofstream(path) << "this is not a record log at all, but it is long enough to look like one";
  auto size = std::filesystem::file_size(path);
  std::vector<std::string> records;
  absl::StatusOr<RecordLog> log = RecordLog::Open(path, &records);
  EXPECT_EQ(log.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(std::filesystem::file_size(path), size);
}

TEST(Outbox, NumbersEntriesAndKeepsThemUntilAcked) {
  FakeRoot dir;
  Outbox outbox = *Outbox::Open(dir.path());
  EXPECT_EQ(outbox.Append(Event("a"))->event().seq(), 1u);
  EXPECT_EQ(outbox.Append(Event("b"))->event().seq(), 2u);
  EXPECT_EQ(outbox.Append(Event("c"))->event().seq(), 3u);
  ASSERT_TRUE(outbox.Ack(2).ok());
  EXPECT_EQ(Kinds(outbox), std::vector<std::string>{"c"});
  EXPECT_EQ(outbox.last_acked(), 2u);
}

TEST(Outbox, ARestartResendsWhatWasNotAckedInOrderAndGoesOnNumbering) {
  FakeRoot dir;
  {
    Outbox outbox = *Outbox::Open(dir.path());
    for (const char* kind : {"a", "b", "c", "d"}) ASSERT_TRUE(outbox.Append(Event(kind)).ok());
    ASSERT_TRUE(outbox.Ack(1).ok());
  }
  {
    Outbox outbox = *Outbox::Open(dir.path());
    EXPECT_EQ(Kinds(outbox), (std::vector<std::string>{"b", "c", "d"}));
    EXPECT_EQ(outbox.last_acked(), 1u);
    EXPECT_EQ(outbox.Append(Event("e"))->event().seq(), 5u);
  }
  // A machine crash may lose the unsynced hint of the Ack: "a" goes again (the gateway drops it
  // by its seq) and the numbering still goes on.
  std::filesystem::resize_file(dir.path() / "outbox.acked.hint", 0);
  Outbox outbox = *Outbox::Open(dir.path());
  EXPECT_EQ(Kinds(outbox), (std::vector<std::string>{"a", "b", "c", "d", "e"}));
  EXPECT_EQ(outbox.Append(Event("f"))->event().seq(), 6u);
}

TEST(Outbox, CompactionPersistsTheAckAndSequenceNumbersNeverGoBack) {
  FakeRoot dir;
  uint64_t appended = 0;
  {
    Outbox outbox = *Outbox::Open(dir.path());
    v1::AgentFrame big = Event("big");
    big.mutable_event()->set_message(std::string(64 * 1024, 'x'));
    while (std::filesystem::file_size(dir.path() / "outbox.log") < Outbox::kCompactBytes)
      appended = outbox.Append(big)->event().seq();
    ASSERT_TRUE(outbox.Append(Event("last")).ok());
    ASSERT_TRUE(outbox.Ack(appended).ok());  // all but "last": compacts
    EXPECT_LT(std::filesystem::file_size(dir.path() / "outbox.log"), 100u);
  }
  Outbox outbox = *Outbox::Open(dir.path());
  EXPECT_EQ(Kinds(outbox), (std::vector<std::string>{"last"}));
  EXPECT_EQ(outbox.last_acked(), appended);
  EXPECT_EQ(outbox.Append(Event("b"))->event().seq(), appended + 2);
}

TEST(Outbox, AFullOutboxRefusesWithAClearMessage) {
  FakeRoot dir;
  Outbox outbox = *Outbox::Open(dir.path(), {.max_entries = 3});
  ASSERT_TRUE(outbox.Append(Event("a")).ok());
  ASSERT_TRUE(outbox.Append(Event("b")).ok());
  absl::StatusOr<v1::AgentFrame> full = outbox.Append(Event("c"));
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(Message(full.status()), "the outbox is full: 2 entries wait for the gateway's Ack");
  // The last slot takes the one event that says so, and nothing else.
  v1::AgentFrame notice = Event("x");
  notice.mutable_event()->set_kind(kOutboxFullEvent);
  ASSERT_TRUE(outbox.Append(notice).ok());
  EXPECT_EQ(outbox.Append(notice).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(outbox.pending().back().event().kind(), "outbox.full");
  // An Ack makes room again.
  ASSERT_TRUE(outbox.Ack(2).ok());
  EXPECT_TRUE(outbox.Append(Event("d")).ok());
}

TEST(Outbox, TakesOnlyUpdatesAndEvents) {
  FakeRoot dir;
  Outbox outbox = *Outbox::Open(dir.path());
  v1::AgentFrame hello;
  hello.mutable_hello();
  EXPECT_EQ(outbox.Append(hello).status().code(), absl::StatusCode::kInvalidArgument);
  v1::AgentFrame update;
  update.mutable_command_update()->set_command_id("c-1");
  EXPECT_EQ(outbox.Append(update)->command_update().seq(), 1u);
}

TEST(Outbox, ACorruptAckFileIsNamed) {
  FakeRoot dir;
  dir.Write("outbox.acked", "twelve");
  EXPECT_EQ(Message(Outbox::Open(dir.path()).status()),
            (dir.path() / "outbox.acked").string() + ": not a sequence number");
}

}  // namespace
}  // namespace bcd
