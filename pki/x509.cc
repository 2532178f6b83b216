#include "pki/x509.h"

#include <openssl/err.h>
#include <openssl/pem.h>

#include <cctype>

#include "fmt/format.h"
#include "proto/absl_compat.h"

namespace bcd::pki {
namespace {

int64_t ToUnix(const ASN1_TIME* time) {
  struct tm tm {};
  if (ASN1_TIME_to_tm(time, &tm) != 1) return 0;
  return static_cast<int64_t>(timegm(&tm));
}

// A trust domain: lowercase letters, digits, '.', '-' and '_' (SPIFFE ID spec §2.1).
bool ValidTrustDomain(std::string_view td) {
  if (td.empty() || td.size() > 255) return false;
  for (char c : td) {
    if (!(std::islower(static_cast<unsigned char>(c)) ||
          std::isdigit(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_')) {
      return false;
    }
  }
  return true;
}

// A path segment: letters, digits, '.', '-' and '_', and not "." or "..".
bool ValidSegment(std::string_view segment) {
  if (segment.empty() || segment == "." || segment == "..") return false;
  for (char c : segment) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_'))
      return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<Certificate> Certificate::FromDer(std::string_view der) {
  const auto* p = reinterpret_cast<const unsigned char*>(der.data());
  X509Ptr cert(d2i_X509(nullptr, &p, static_cast<long>(der.size())));
  if (!cert || p != reinterpret_cast<const unsigned char*>(der.data()) + der.size()) {
    return absl::InvalidArgumentError("not a DER certificate: " + OpenSslError("trailing bytes"));
  }
  return Certificate(std::move(cert), std::string(der));
}

absl::StatusOr<Certificate> Certificate::FromPem(std::string_view pem) {
  absl::StatusOr<std::vector<Certificate>> chain = ParsePemChain(pem);
  if (!chain.ok()) return chain.status();
  if (chain->size() != 1) {
    return absl::InvalidArgumentError(
        fmt::format("expected one PEM certificate, found {}", chain->size()));
  }
  return chain->front();
}

std::string Certificate::Pem() const {
  BioPtr bio(BIO_new(BIO_s_mem()));
  PEM_write_bio_X509(bio.get(), cert_.get());
  return BioContents(bio.get());
}

std::string Certificate::SpkiDer() const { return SpkiDerOf(X509_get0_pubkey(cert_.get())); }

int64_t Certificate::NotBefore() const { return ToUnix(X509_get0_notBefore(cert_.get())); }
int64_t Certificate::NotAfter() const { return ToUnix(X509_get0_notAfter(cert_.get())); }

std::vector<std::string> Certificate::UriSans() const {
  std::vector<std::string> uris;
  GeneralNamesPtr names(static_cast<GENERAL_NAMES*>(
      X509_get_ext_d2i(cert_.get(), NID_subject_alt_name, nullptr, nullptr)));
  if (!names) return uris;
  for (int i = 0; i < sk_GENERAL_NAME_num(names.get()); ++i) {
    const GENERAL_NAME* name = sk_GENERAL_NAME_value(names.get(), i);
    if (name->type != GEN_URI) continue;
    const ASN1_IA5STRING* uri = name->d.uniformResourceIdentifier;
    uris.emplace_back(reinterpret_cast<const char*>(ASN1_STRING_get0_data(uri)),
                      static_cast<std::size_t>(ASN1_STRING_length(uri)));
  }
  return uris;
}

std::string Certificate::Subject() const {
  BioPtr bio(BIO_new(BIO_s_mem()));
  X509_NAME_print_ex(bio.get(), X509_get_subject_name(cert_.get()), 0, XN_FLAG_ONELINE);
  return BioContents(bio.get());
}

absl::StatusOr<std::vector<Certificate>> ParsePemChain(std::string_view pem) {
  BioPtr bio = ReadBio(pem);
  std::vector<Certificate> chain;
  ERR_clear_error();
  while (true) {
    X509Ptr cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
    if (!cert) break;
    std::string der = CertificateDerOf(cert.get());
    chain.push_back(*Certificate::FromDer(der));
  }
  // The end of the input leaves a "no start line" error; anything else is a certificate that
  // begins and does not parse (cut short, or damaged).
  unsigned long error = ERR_peek_last_error();
  bool clean_end =
      ERR_GET_LIB(error) == ERR_LIB_PEM && ERR_GET_REASON(error) == PEM_R_NO_START_LINE;
  std::string why = OpenSslError();
  if (!clean_end) {
    return absl::InvalidArgumentError(
        fmt::format("PEM certificate {} is damaged or cut short: {}", chain.size() + 1, why));
  }
  if (chain.empty()) return absl::InvalidArgumentError("no PEM certificate found");
  return chain;
}

absl::StatusOr<std::vector<Certificate>> ParseDerChain(const std::vector<std::string>& der) {
  std::vector<Certificate> chain;
  for (std::size_t i = 0; i < der.size(); ++i) {
    absl::StatusOr<Certificate> cert = Certificate::FromDer(der[i]);
    if (!cert.ok()) {
      return absl::InvalidArgumentError(
          fmt::format("chain certificate {}: {}", i, ToStd(cert.status().message())));
    }
    chain.push_back(*std::move(cert));
  }
  if (chain.empty()) return absl::InvalidArgumentError("the chain is empty");
  return chain;
}

absl::Status VerifyChain(const std::vector<Certificate>& chain,
                         const std::vector<Certificate>& anchors, int64_t now) {
  if (chain.empty()) return absl::UnauthenticatedError("the chain is empty");
  if (anchors.empty()) return absl::UnauthenticatedError("no trust anchors to verify against");
  X509StorePtr store(X509_STORE_new());
  for (const Certificate& anchor : anchors) X509_STORE_add_cert(store.get(), anchor.get());
  X509StackPtr untrusted(sk_X509_new_null());
  for (std::size_t i = 1; i < chain.size(); ++i) {
    X509_up_ref(chain[i].get());
    sk_X509_push(untrusted.get(), chain[i].get());
  }
  X509StoreCtxPtr ctx(X509_STORE_CTX_new());
  if (X509_STORE_CTX_init(ctx.get(), store.get(), chain[0].get(), untrusted.get()) != 1) {
    return absl::InternalError("cannot start chain verification: " + OpenSslError());
  }
  X509_VERIFY_PARAM* param = X509_STORE_CTX_get0_param(ctx.get());
  X509_VERIFY_PARAM_set_time(param, static_cast<time_t>(now));
  X509_VERIFY_PARAM_set_flags(param, X509_V_FLAG_PARTIAL_CHAIN | X509_V_FLAG_X509_STRICT);
  if (X509_verify_cert(ctx.get()) != 1) {
    int error = X509_STORE_CTX_get_error(ctx.get());
    OpenSslError();
    return absl::UnauthenticatedError(
        fmt::format("{}: {}", chain[0].Subject(), X509_verify_cert_error_string(error)));
  }
  return absl::OkStatus();
}

absl::StatusOr<SpiffeId> SpiffeId::Parse(std::string_view uri) {
  constexpr std::string_view kScheme = "spiffe://";
  auto bad = [&](std::string_view why) {
    return absl::InvalidArgumentError(fmt::format("\"{}\" is not a node SPIFFE id: {}", uri, why));
  };
  if (!uri.starts_with(kScheme)) return bad("it does not start with spiffe://");
  std::string_view rest = uri.substr(kScheme.size());
  std::size_t slash = rest.find('/');
  if (slash == std::string_view::npos) return bad("it has no path");
  std::string_view td = rest.substr(0, slash);
  if (!ValidTrustDomain(td))
    return bad("the trust domain is not lowercase letters, digits, '.', '-', '_'");
  std::vector<std::string_view> segments;
  std::string_view path = rest.substr(slash + 1);
  while (true) {
    std::size_t next = path.find('/');
    segments.push_back(path.substr(0, next));
    if (next == std::string_view::npos) break;
    path.remove_prefix(next + 1);
  }
  if (segments.size() != 4 || segments[0] != "site" || segments[2] != "node") {
    return bad("the path is not /site/<site>/node/<node>");
  }
  if (!ValidSegment(segments[1]) || !ValidSegment(segments[3])) {
    return bad("a site or node name is not letters, digits, '.', '-', '_'");
  }
  SpiffeId id;
  id.trust_domain_ = std::string(td);
  id.site_ = std::string(segments[1]);
  id.node_ = std::string(segments[3]);
  return id;
}

absl::StatusOr<SpiffeId> SpiffeId::Make(std::string_view trust_domain, std::string_view site,
                                        std::string_view node) {
  return Parse(fmt::format("spiffe://{}/site/{}/node/{}", trust_domain, site, node));
}

std::string SpiffeId::ToString() const {
  return fmt::format("spiffe://{}/site/{}/node/{}", trust_domain_, site_, node_);
}

absl::StatusOr<NodeIdentity> IdentityOf(const Certificate& certificate) {
  std::optional<SpiffeId> id;
  int spiffe_count = 0;
  std::optional<uint64_t> generation;
  bool tenant_controlled = false;
  for (const std::string& uri : certificate.UriSans()) {
    if (uri.starts_with("spiffe://")) {
      ++spiffe_count;
      absl::StatusOr<SpiffeId> parsed = SpiffeId::Parse(uri);
      if (!parsed.ok()) return parsed.status();
      id = *parsed;
    } else if (uri.starts_with("urn:bc:generation:")) {
      std::string_view digits = std::string_view(uri).substr(18);
      uint64_t value = 0;
      bool ok = !digits.empty() && digits.size() <= 19;
      for (char c : digits) {
        ok = ok && std::isdigit(static_cast<unsigned char>(c));
        value = value * 10 + static_cast<uint64_t>(c - '0');
      }
      if (!ok) return absl::InvalidArgumentError(fmt::format("\"{}\" is not a generation", uri));
      generation = value;
    } else if (uri == "urn:bc:tenant-controlled") {
      tenant_controlled = true;
    }
  }
  if (spiffe_count != 1) {
    return absl::InvalidArgumentError(
        fmt::format("{}: a node certificate needs exactly one SPIFFE URI SAN, found {}",
                    certificate.Subject(), spiffe_count));
  }
  return NodeIdentity{*id, generation, tenant_controlled};
}

absl::StatusOr<std::string> CreateCsr(const PrivateKey& key, std::string_view common_name) {
  X509ReqPtr req(X509_REQ_new());
  X509NamePtr name(X509_NAME_new());
  if (!req || !name ||
      X509_NAME_add_entry_by_txt(name.get(), "CN", MBSTRING_UTF8,
                                 reinterpret_cast<const unsigned char*>(common_name.data()),
                                 static_cast<int>(common_name.size()), -1, 0) != 1 ||
      X509_REQ_set_version(req.get(), 0) != 1 ||
      X509_REQ_set_subject_name(req.get(), name.get()) != 1 ||
      X509_REQ_set_pubkey(req.get(), key.get()) != 1 ||
      X509_REQ_sign(req.get(), key.get(), EVP_sha256()) <= 0) {
    return absl::InternalError("cannot create the CSR: " + OpenSslError());
  }
  unsigned char* der = nullptr;
  int length = i2d_X509_REQ(req.get(), &der);
  std::string out(reinterpret_cast<char*>(der), static_cast<std::size_t>(std::max(length, 0)));
  OPENSSL_free(der);
  return out;
}

absl::StatusOr<PublicKey> VerifyCsr(std::string_view der) {
  const auto* p = reinterpret_cast<const unsigned char*>(der.data());
  X509ReqPtr req(d2i_X509_REQ(nullptr, &p, static_cast<long>(der.size())));
  if (!req || p != reinterpret_cast<const unsigned char*>(der.data()) + der.size()) {
    return absl::InvalidArgumentError("not a DER PKCS#10 CSR: " + OpenSslError("trailing bytes"));
  }
  EVP_PKEY* key = X509_REQ_get0_pubkey(req.get());
  if (key == nullptr) return absl::InvalidArgumentError("the CSR has no public key");
  if (X509_REQ_verify(req.get(), key) != 1) {
    OpenSslError();
    return absl::UnauthenticatedError("the CSR's self-signature does not verify");
  }
  return PublicKey::FromSpkiDer(SpkiDerOf(key));
}

}  // namespace bcd::pki
