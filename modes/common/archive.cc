#include "modes/common/archive.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "base/files.h"
#include "fmt/format.h"

namespace bcd {

namespace {

// A zero-padded octal number filling `width - 1` digits and a NUL, as ustar fields are.
void Octal(char* field, std::size_t width, uint64_t value) {
  field[width - 1] = '\0';
  for (std::size_t i = width - 1; i-- > 0;) {
    field[i] = static_cast<char>('0' + (value & 7));
    value >>= 3;
  }
}

}  // namespace

struct TarGzWriter::State {
  std::filesystem::path path;
  int fd = -1;
  z_stream z{};
  bool z_open = false;
  EVP_MD_CTX* sha = nullptr;
  uint64_t written = 0;
  bool finished = false;
};

TarGzWriter::TarGzWriter(std::unique_ptr<State> state) : state_(std::move(state)) {}

const std::filesystem::path& TarGzWriter::path() const { return state_->path; }

TarGzWriter::~TarGzWriter() {
  if (state_->z_open) deflateEnd(&state_->z);
  if (state_->sha != nullptr) EVP_MD_CTX_free(state_->sha);
  if (state_->fd >= 0) close(state_->fd);
}

absl::StatusOr<std::unique_ptr<TarGzWriter>> TarGzWriter::Create(const std::filesystem::path& dir,
                                                                 std::string_view prefix) {
  auto state = std::make_unique<State>();
  std::string name = (dir / (std::string(prefix) + "XXXXXX.tar.gz")).string();
  state->fd = mkostemps(name.data(), 7, O_CLOEXEC);  // 0600
  if (state->fd < 0) {
    return absl::InternalError(
        fmt::format("cannot create a file in {}: {}", dir.string(), std::strerror(errno)));
  }
  state->path = name;
  // windowBits 15 + 16: a gzip wrapper rather than zlib's.
  if (deflateInit2(&state->z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) {
    return absl::InternalError("zlib: deflateInit2 failed");
  }
  state->z_open = true;
  state->sha = EVP_MD_CTX_new();
  if (state->sha == nullptr || EVP_DigestInit_ex(state->sha, EVP_sha256(), nullptr) != 1) {
    return absl::InternalError("openssl: cannot start SHA-256");
  }
  return std::unique_ptr<TarGzWriter>(new TarGzWriter(std::move(state)));
}

absl::Status TarGzWriter::Write(std::string_view bytes, bool finish) {
  State& s = *state_;
  s.z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes.data()));
  s.z.avail_in = static_cast<uInt>(bytes.size());
  unsigned char out[16384];
  int rc = Z_OK;
  do {
    s.z.next_out = out;
    s.z.avail_out = sizeof out;
    rc = deflate(&s.z, finish ? Z_FINISH : Z_NO_FLUSH);
    if (rc == Z_STREAM_ERROR) return absl::InternalError("zlib: deflate failed");
    std::size_t have = sizeof out - s.z.avail_out;
    EVP_DigestUpdate(s.sha, out, have);
    for (std::size_t done = 0; done < have;) {
      ssize_t n = ::write(s.fd, out + done, have - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        return absl::InternalError(fmt::format("{}: {}", s.path.string(), std::strerror(errno)));
      }
      done += static_cast<std::size_t>(n);
    }
    s.written += have;
  } while (s.z.avail_out == 0 || (finish && rc != Z_STREAM_END));
  return absl::OkStatus();
}

absl::Status TarGzWriter::Add(std::string_view name, std::string_view contents, int64_t mtime) {
  if (state_->finished) return absl::FailedPreconditionError("the archive is finished");
  if (contents.size() >= (uint64_t{1} << 33)) {
    return absl::InvalidArgumentError("an archive member must be under 8 GiB");
  }
  if (name.empty() || name.size() >= 100) {
    return absl::InvalidArgumentError(
        fmt::format("archive member name \"{}\" must be 1 to 99 bytes", name));
  }
  char header[512] = {};
  std::memcpy(header, name.data(), name.size());
  Octal(header + 100, 8, 0644);
  Octal(header + 108, 8, 0);
  Octal(header + 116, 8, 0);
  Octal(header + 124, 12, contents.size());  // 11 digits: up to 8 GiB
  Octal(header + 136, 12, static_cast<uint64_t>(std::max<int64_t>(0, mtime)));
  std::memset(header + 148, ' ', 8);  // the checksum counts its own field as spaces
  header[156] = '0';                  // regular file
  // Fixed fields, NUL-padded by the zeroed header (the version "00" has no NUL of its own).
  auto put = [&](std::size_t at, std::string_view text) {
    std::copy(text.begin(), text.end(), header + at);
  };
  put(257, std::string_view("ustar\0", 6));
  put(263, "00");
  put(265, "root");
  put(297, "root");
  unsigned sum = 0;
  for (unsigned char c : header) sum += c;
  Octal(header + 148, 7, sum);  // six digits and a NUL; the space at 155 stays
  if (absl::Status s = Write({header, sizeof header}, false); !s.ok()) return s;
  if (absl::Status s = Write(contents, false); !s.ok()) return s;
  static const char kZeros[512] = {};
  std::size_t pad = (512 - contents.size() % 512) % 512;
  return Write({kZeros, pad}, false);
}

absl::StatusOr<TarGzWriter::Summary> TarGzWriter::Finish() {
  State& s = *state_;
  if (s.finished) return absl::FailedPreconditionError("the archive is finished");
  static const char kEnd[1024] = {};
  if (absl::Status st = Write({kEnd, sizeof kEnd}, true); !st.ok()) return st;
  s.finished = true;
  if (SyncFile(s.fd) != 0 || close(s.fd) != 0) {
    s.fd = -1;
    return absl::InternalError(fmt::format("{}: {}", s.path.string(), std::strerror(errno)));
  }
  s.fd = -1;
  Summary summary;
  summary.size_bytes = s.written;
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned length = 0;
  EVP_DigestFinal_ex(s.sha, digest, &length);
  summary.sha256.assign(reinterpret_cast<char*>(digest), length);
  return summary;
}

}  // namespace bcd
