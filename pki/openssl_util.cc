#include "pki/openssl_util.h"

#include <openssl/err.h>

#include <algorithm>

namespace bcd::pki {

std::string OpenSslError(const char* fallback) {
  unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code == 0) return fallback;
  char buffer[256];
  ERR_error_string_n(code, buffer, sizeof buffer);
  return buffer;
}

BioPtr ReadBio(std::string_view data) {
  return BioPtr(BIO_new_mem_buf(data.data(), static_cast<int>(data.size())));
}

std::string CertificateDerOf(X509* cert) {
  unsigned char* der = nullptr;
  int length = i2d_X509(cert, &der);
  std::string out(reinterpret_cast<char*>(der), static_cast<std::size_t>(std::max(length, 0)));
  OPENSSL_free(der);
  return out;
}

std::string SpkiDerOf(EVP_PKEY* key) {
  unsigned char* der = nullptr;
  int length = i2d_PUBKEY(key, &der);
  std::string out(reinterpret_cast<char*>(der), static_cast<std::size_t>(std::max(length, 0)));
  OPENSSL_free(der);
  return out;
}

std::string BioContents(BIO* bio) {
  char* data = nullptr;
  long size = BIO_get_mem_data(bio, &data);
  return size > 0 ? std::string(data, static_cast<std::size_t>(size)) : std::string();
}

}  // namespace bcd::pki
