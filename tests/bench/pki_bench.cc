// Prints ES256 verify/s, JWE open/s and chain verify/s, next to `openssl speed ecdsap256` run in
// the same program (the same machine, the same minute). Medians of several rounds.
//
//   build/tests/bench/pki_bench [rounds]

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "pki/jwe.h"
#include "pki/keys.h"
#include "pki/x509.h"

namespace {

using bcd::pki::PrivateKey;

double MedianPerSecond(int rounds, int iterations, const std::function<void()>& op) {
  std::vector<double> rates;
  for (int r = 0; r < rounds; ++r) {
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < iterations; ++i) op();
    std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
    rates.push_back(iterations / elapsed.count());
  }
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

// verify/s from `openssl speed -seconds 2 ecdsap256`, or 0 when it cannot run.
double OpensslVerifyPerSecond() {
  FILE* pipe = popen("openssl speed -seconds 2 ecdsap256 2>/dev/null", "r");
  if (!pipe) return 0;
  char line[512];
  double verify = 0;
  while (fgets(line, sizeof line, pipe)) {
    double sign_s = 0, verify_s = 0, sign_rate = 0, verify_rate = 0;
    if (std::sscanf(line, " 256 bits ecdsa (nistp256) %lfs %lfs %lf %lf", &sign_s, &verify_s,
                    &sign_rate, &verify_rate) == 4) {
      verify = verify_rate;
    }
  }
  pclose(pipe);
  return verify;
}

template <typename T>
T Must(absl::StatusOr<T> value) {
  if (!value.ok()) std::abort();
  return *std::move(value);
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = argc > 1 ? std::atoi(argv[1]) : 7;
  PrivateKey key = Must(PrivateKey::Generate());
  bcd::pki::PublicKey pub = key.Public();
  std::string message(256, 'm');
  std::string sig = Must(key.SignEs256(message));
  double verify = MedianPerSecond(rounds, 2000, [&] {
    if (!pub.VerifyEs256(message, sig).ok()) std::abort();
  });

  PrivateKey recipient = Must(PrivateKey::Generate());
  std::string jwe =
      Must(bcd::pki::SealJwe(std::string(64, 's'), recipient.Public(), bcd::pki::kSecretJweType,
                             {{"ref", "secret://x"}, {"rid", "r"}}, 4000000000));
  double open = MedianPerSecond(rounds, 1000, [&] {
    if (!bcd::pki::OpenJwe(jwe, recipient,
                           {bcd::pki::kSecretJweType, {{"ref", "secret://x"}, {"rid", "r"}}, 0})
             .ok()) {
      std::abort();
    }
  });

  const char* dir = std::getenv("BCD_PKI_CERTS");
  std::string certs = dir ? dir : std::string(BCD_SOURCE_DIR) + "/tests/fixtures/pki/certs";
  auto read = [&](const std::string& name) {
    FILE* f = std::fopen((certs + "/" + name).c_str(), "rb");
    std::string out;
    char buffer[4096];
    for (std::size_t n; f && (n = std::fread(buffer, 1, sizeof buffer, f)) > 0;)
      out.append(buffer, n);
    if (f) std::fclose(f);
    return out;
  };
  std::vector<bcd::pki::Certificate> chain =
      Must(bcd::pki::ParsePemChain(read("node.pem") + read("intermediate.pem")));
  std::vector<bcd::pki::Certificate> roots = Must(bcd::pki::ParsePemChain(read("root.pem")));
  int64_t now = chain[0].NotBefore() + 3600;
  double chains = MedianPerSecond(rounds, 1000, [&] {
    if (!bcd::pki::VerifyChain(chain, roots, now).ok()) std::abort();
  });

  double openssl = OpensslVerifyPerSecond();
  std::printf("median of %d rounds, one core\n", rounds);
  std::printf("ES256 verify (bcd::pki)         %9.0f /s\n", verify);
  std::printf("ECDSA P-256 verify (openssl)    %9.0f /s   bcd/openssl %.2f\n", openssl,
              openssl > 0 ? verify / openssl : 0.0);
  std::printf("JWE open (ECDH-ES+A256KW)       %9.0f /s\n", open);
  std::printf("chain verify (leaf+CA -> root)  %9.0f /s\n", chains);
  return 0;
}
