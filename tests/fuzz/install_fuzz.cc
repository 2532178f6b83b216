// `bcd install-script` on arbitrary flags: the input is NUL-separated arguments, and after an
// empty argument (two NULs) the content every file flag reads. Nothing may crash or leak, and an
// installer that is printed must hold each value as a single-quoted word that reads back as the
// value itself (what sh will see), and no here-document that ends early.

#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "install/install_script.h"

namespace {

// Reads one sh word made of single-quoted parts and \' escapes from the start of `text`; nullopt
// when it is not such a word.
std::optional<std::string> ReadQuoted(std::string_view text, std::size_t* used) {
  std::string out;
  std::size_t i = 0;
  if (text.empty() || text[0] != '\'') return std::nullopt;
  while (i < text.size() && (text[i] == '\'' || text.substr(i, 2) == "\\'")) {
    if (text[i] == '\\') {
      out += '\'';
      i += 2;
      continue;
    }
    std::size_t end = text.find('\'', i + 1);
    if (end == std::string_view::npos) return std::nullopt;
    out += text.substr(i + 1, end - i - 1);
    i = end + 1;
  }
  *used = i;
  return out;
}

void CheckValue(const std::string& script, const std::string& name, const std::string& value) {
  std::string prefix = "\n" + name + "=";
  std::size_t at = script.find(prefix);
  if (at == std::string::npos) std::abort();
  std::string_view rest = std::string_view(script).substr(at + prefix.size());
  std::size_t used = 0;
  std::optional<std::string> read = ReadQuoted(rest, &used);
  if (!read || *read != value || used >= rest.size() || rest[used] != '\n') std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> args;
  std::string file;
  std::size_t start = 0;
  while (start <= input.size()) {
    std::size_t nul = input.find('\0', start);
    std::string_view arg = input.substr(start, nul == std::string_view::npos ? nul : nul - start);
    if (arg.empty() && nul != std::string_view::npos) {
      file = std::string(input.substr(nul + 1));
      break;
    }
    args.emplace_back(arg);
    if (nul == std::string_view::npos) break;
    start = nul + 1;
  }
  absl::StatusOr<bcd::install::InstallOptions> options = bcd::install::ParseInstallFlags(
      args, [&](const std::string&) -> absl::StatusOr<std::string> { return file; });
  if (!options.ok()) return 0;
  absl::StatusOr<std::string> script = bcd::install::GenerateInstallScript(*options);
  if (!script.ok()) return 0;
  CheckValue(*script, "token", options->token);
  CheckValue(*script, "gateway_url", options->gateway_url);
  CheckValue(*script, "binary_url", options->binary_url.value_or(""));
  // Each here-document ends where it should: its delimiter appears only as its own last line.
  for (std::string_view delimiter : {"BCD_UNIT_END", "BCD_PEM_END"}) {
    std::string opener = "<<'" + std::string(delimiter) + "'\n";
    std::size_t at = 0;
    while ((at = script->find(opener, at)) != std::string::npos) {
      std::size_t body = at + opener.size();
      std::size_t end = script->find("\n" + std::string(delimiter) + "\n", body - 1);
      if (end == std::string::npos) std::abort();
      at = end + 1;
    }
  }
  return 0;
}
