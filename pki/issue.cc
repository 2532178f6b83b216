#include "pki/issue.h"

#include <openssl/rand.h>

#include "fmt/format.h"

namespace bcd::pki {
namespace {

bool AddExtension(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
  if (ext == nullptr) return false;
  bool ok = X509_add_ext(cert, ext, -1) == 1;
  X509_EXTENSION_free(ext);
  return ok;
}

}  // namespace

absl::StatusOr<Certificate> IssueCertificate(const CertificateSpec& spec, const PublicKey& subject,
                                             const PrivateKey& issuer_key,
                                             const Certificate* issuer) {
  X509Ptr cert(X509_new());
  X509NamePtr name(X509_NAME_new());
  BignumPtr serial(BN_new());
  if (!cert || !name || !serial) return absl::InternalError("out of memory");
  BN_rand(serial.get(), 64, BN_RAND_TOP_ANY, BN_RAND_BOTTOM_ANY);
  X509_set_version(cert.get(), 2);
  BN_to_ASN1_INTEGER(serial.get(), X509_get_serialNumber(cert.get()));
  X509_NAME_add_entry_by_txt(name.get(), "CN", MBSTRING_UTF8,
                             reinterpret_cast<const unsigned char*>(spec.common_name.c_str()), -1,
                             -1, 0);
  X509_set_subject_name(cert.get(), name.get());
  X509_set_issuer_name(cert.get(), issuer ? X509_get_subject_name(issuer->get()) : name.get());
  ASN1_TIME_set(X509_getm_notBefore(cert.get()), static_cast<time_t>(spec.not_before));
  ASN1_TIME_set(X509_getm_notAfter(cert.get()), static_cast<time_t>(spec.not_after));
  X509_set_pubkey(cert.get(), subject.get());
  X509* issuer_cert = issuer ? issuer->get() : cert.get();
  std::string sans;
  for (const std::string& uri : spec.uri_sans) sans += (sans.empty() ? "" : ",") + ("URI:" + uri);
  for (const std::string& dns : spec.dns_sans) sans += (sans.empty() ? "" : ",") + ("DNS:" + dns);
  for (const std::string& ip : spec.ip_sans) sans += (sans.empty() ? "" : ",") + ("IP:" + ip);
  std::string eku;
  if (spec.client_auth) eku += "clientAuth";
  if (spec.server_auth) eku += (eku.empty() ? "" : ",") + std::string("serverAuth");
  bool ok =
      AddExtension(cert.get(), issuer_cert, NID_basic_constraints,
                   spec.is_ca ? "critical,CA:TRUE" : "critical,CA:FALSE") &&
      AddExtension(cert.get(), issuer_cert, NID_key_usage,
                   spec.is_ca ? "critical,keyCertSign,cRLSign" : "critical,digitalSignature") &&
      AddExtension(cert.get(), issuer_cert, NID_subject_key_identifier, "hash") &&
      AddExtension(cert.get(), issuer_cert, NID_authority_key_identifier, "keyid:always") &&
      (sans.empty() || AddExtension(cert.get(), issuer_cert, NID_subject_alt_name, sans)) &&
      (eku.empty() || AddExtension(cert.get(), issuer_cert, NID_ext_key_usage, eku));
  if (!ok)
    return absl::InvalidArgumentError("cannot add a certificate extension: " + OpenSslError());
  if (X509_sign(cert.get(), issuer_key.get(), EVP_sha256()) <= 0) {
    return absl::InternalError("cannot sign the certificate: " + OpenSslError());
  }
  return Certificate::FromDer(CertificateDerOf(cert.get()));
}

}  // namespace bcd::pki
