// Drives the record log's reader (RecordLog::Parse, what Open reads) and asserts the rule for a
// damaged file: it is read whole, cut only at a partial last record, or refused as DataLoss naming
// the offset; never silently shortened before its last record.
//
// The first byte picks the mode. Even: the rest is a file as is. Odd: the rest makes records (each
// a length byte and that many bytes), which are serialized as Rewrite writes them, and then one
// byte is flipped (at an offset from the input) or the file is cut short; what the reader returns
// is then known exactly.

#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "daemon/delivery/record_log.h"
#include "pki/keys.h"
#include "proto/absl_compat.h"

namespace {

void Require(bool holds, const char* what) {
  if (!holds) {
    fprintf(stderr, "record log rule broken: %s\n", what);
    abort();
  }
}

// A refusal must be DataLoss and say where.
void RequireNamedDataLoss(const absl::Status& status) {
  Require(status.code() == absl::StatusCode::kDataLoss, "an error that is not DataLoss");
  Require(std::string(bcd::ToStd(status.message())).find("at byte") != std::string::npos,
          "a DataLoss that does not name the offset");
}

uint32_t U32(std::string_view b) {
  return static_cast<uint32_t>(static_cast<unsigned char>(b[0])) << 24 |
         static_cast<uint32_t>(static_cast<unsigned char>(b[1])) << 16 |
         static_cast<uint32_t>(static_cast<unsigned char>(b[2])) << 8 |
         static_cast<uint32_t>(static_cast<unsigned char>(b[3]));
}

void RawFile(std::string_view bytes) {
  auto parsed = bcd::RecordLog::Parse(bytes, "/fuzz/log");
  if (!parsed.ok()) return RequireNamedDataLoss(parsed.status());
  Require(parsed->kept <= bytes.size(), "kept more than the file");
  if (parsed->legacy) return;  // rewritten whole by Open; its reading is checked below
  if (parsed->kept == 0) {
    // Only an empty file or a torn magic holds nothing.
    Require(bcd::RecordLog::kMagic.substr(0, bytes.size()) == bytes, "a file read as empty");
    return;
  }
  // What was kept is exactly the records read, in the format Rewrite writes.
  Require(bcd::RecordLog::Serialize(parsed->records) == bytes.substr(0, parsed->kept),
          "the kept bytes are not the records read");
  // What was cut is a partial last record: no whole record with its checks at its start, and a
  // header there (when whole and not zeros) whose own check holds.
  std::string_view tail = bytes.substr(parsed->kept);
  if (tail.empty()) return;
  bool zeros = tail.find_first_not_of('\0') == std::string_view::npos;
  if (tail.size() < bcd::RecordLog::kHeaderBytes || zeros) return;
  std::string length(tail.substr(0, 4));
  Require(bcd::pki::Sha256(length).substr(0, 4) == tail.substr(4, 4),
          "a damaged header was cut as a torn tail");
  uint32_t size = U32(tail);
  if (tail.size() >= bcd::RecordLog::kHeaderBytes + size) {
    Require(tail.size() == bcd::RecordLog::kHeaderBytes + size,
            "a record with something after it was cut");
    std::string record(tail.substr(bcd::RecordLog::kHeaderBytes, size));
    Require(bcd::pki::Sha256(length + record).substr(0, 4) != tail.substr(8, 4),
            "a whole, valid last record was cut");
  }
}

void Mutated(std::string_view input) {
  if (input.size() < 4) return;
  uint16_t where = static_cast<uint16_t>(static_cast<unsigned char>(input[0]) << 8 |
                                         static_cast<unsigned char>(input[1]));
  unsigned char flip = static_cast<unsigned char>(input[2]);
  bool cut = (flip & 1) != 0;
  flip = static_cast<unsigned char>(flip | 1);  // never 0: the byte changes
  std::vector<std::string> records;
  for (std::string_view rest = input.substr(3); !rest.empty();) {
    std::size_t size = std::min<std::size_t>(static_cast<unsigned char>(rest[0]), rest.size() - 1);
    records.emplace_back(rest.substr(1, size));
    rest = rest.substr(1 + size);
  }
  std::vector<uint64_t> offsets;
  std::string file = bcd::RecordLog::Serialize(records, &offsets);
  std::size_t at = where % (file.size() + 1);
  auto parsed = bcd::RecordLog::Parse(file, "/fuzz/log");
  Require(parsed.ok() && parsed->records == records && parsed->kept == file.size(),
          "an undamaged log was not read whole");
  // The records that lie wholly before `at`.
  std::size_t whole = 0;
  while (whole < records.size() &&
         offsets[whole] + bcd::RecordLog::kHeaderBytes + records[whole].size() <= at)
    ++whole;
  if (cut) {
    parsed = bcd::RecordLog::Parse(std::string_view(file).substr(0, at), "/fuzz/log");
    Require(parsed.ok(), "a log cut short was refused");
    Require(parsed->records == std::vector<std::string>(records.begin(), records.begin() + whole),
            "a log cut short lost a whole record, or kept a partial one");
    return;
  }
  if (at == file.size()) return;
  file[at] = static_cast<char>(file[at] ^ flip);
  parsed = bcd::RecordLog::Parse(file, "/fuzz/log");
  bool in_last = !records.empty() && at >= offsets.back();
  if (!parsed.ok()) return RequireNamedDataLoss(parsed.status());
  Require(in_last, "a flipped byte before the last record went unnoticed");
  Require(parsed->records == std::vector<std::string>(records.begin(), records.end() - 1),
          "a flipped byte in the last record did more than cut it");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  if ((data[0] & 1) == 0) {
    RawFile(bytes);
  } else {
    Mutated(bytes);
  }
  return 0;
}
