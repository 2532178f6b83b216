#include "transport/tls.h"

#include <arpa/inet.h>
#include <openssl/conf.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <cstdio>
#include <cstring>
#include <ctime>

#include "base/mutex.h"
#include "fmt/format.h"
#include "grpc/support/log.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/resource_quota.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_certificate_verifier.h"
#include "grpcpp/security/tls_credentials_options.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/support/channel_arguments.h"
#include "pki/issue.h"
#include "pki/keys.h"
#include "pki/openssl_util.h"
#include "pki/x509.h"
#include "proto/absl_compat.h"
#include "transport/proxy.h"

namespace bcd::transport {
namespace {

constexpr char kTls13Config[] = R"(
openssl_conf = bcd_openssl_init
[bcd_openssl_init]
ssl_conf = bcd_ssl_sect
[bcd_ssl_sect]
system_default = bcd_system_default
[bcd_system_default]
MinProtocol = TLSv1.3
Protocol = -SSLv3, -TLSv1, -TLSv1.1, -TLSv1.2
)";

class PinnedCaVerifier : public grpc::experimental::ExternalCertificateVerifier {
 public:
  PinnedCaVerifier(std::array<uint8_t, 32> pin, std::string server_name,
                   std::shared_ptr<VerificationLog> log, UnixClock now)
      : pin_(pin.begin(), pin.end()),
        server_name_(std::move(server_name)),
        log_(std::move(log)),
        now_(std::move(now)) {}

  bool Verify(grpc::experimental::TlsCustomVerificationCheckRequest* request,
              std::function<void(grpc::Status)>, grpc::Status* sync_status) override {
    absl::Status status = Check(std::string(request->peer_cert_full_chain().data(),
                                            request->peer_cert_full_chain().size()));
    if (status.ok()) {
      *sync_status = grpc::Status::OK;
    } else {
      std::string reason(ToStd(status.message()));
      if (log_) log_->Record(reason);
      *sync_status = grpc::Status(grpc::StatusCode::UNAUTHENTICATED, reason);
    }
    return true;
  }

  void Cancel(grpc::experimental::TlsCustomVerificationCheckRequest*) override {}

 private:
  absl::Status Check(const std::string& chain_pem) const {
    absl::StatusOr<std::vector<pki::Certificate>> chain = pki::ParsePemChain(chain_pem);
    if (!chain.ok()) return absl::UnauthenticatedError("the gateway sent no certificate chain");
    if (!now_) return absl::InternalError("no clock to check the gateway's certificates against");
    return CheckPinnedChain(*chain, pin_, server_name_, now_());
  }

  std::string pin_;
  std::string server_name_;
  std::shared_ptr<VerificationLog> log_;
  UnixClock now_;
};

}  // namespace

absl::Status CheckPinnedChain(const std::vector<pki::Certificate>& chain, std::string_view pin,
                              const std::string& server_name, int64_t now) {
  if (chain.empty()) return absl::UnauthenticatedError("the gateway sent no certificate chain");
  const pki::Certificate* anchor = nullptr;
  for (const pki::Certificate& cert : chain) {
    if (cert.SpkiSha256() == pin) anchor = &cert;
  }
  if (anchor == nullptr) {
    return absl::UnauthenticatedError(fmt::format(
        "the gateway's certificate chain does not lead to the pinned CA (SPKI sha256 {})",
        pki::Hex(pin)));
  }
  if (absl::Status s = pki::VerifyChain(chain, {*anchor}, now); !s.ok()) {
    return absl::UnauthenticatedError(
        fmt::format("the gateway's certificate: {}", ToStd(s.message())));
  }
  X509* leaf = chain.front().get();
  int match = IpBytes(server_name)
                  ? X509_check_ip_asc(leaf, server_name.c_str(), 0)
                  : X509_check_host(leaf, server_name.c_str(), server_name.size(), 0, nullptr);
  if (match != 1) {
    return absl::UnauthenticatedError(
        fmt::format("the gateway's certificate ({}) is not valid for the name \"{}\"",
                    chain.front().Subject(), server_name));
  }
  return absl::OkStatus();
}

absl::Status RequireTls13() {
  static const absl::Status* result = [] {
    // Loaded before gRPC creates any SSL_CTX; applies to every context (client and server).
    pki::BioPtr bio = pki::ReadBio(kTls13Config);
    CONF* conf = NCONF_new_ex(nullptr, nullptr);
    long error_line = 0;
    bool ok = conf != nullptr && NCONF_load_bio(conf, bio.get(), &error_line) == 1 &&
              CONF_modules_load(conf, nullptr, 0) == 1;
    NCONF_free(conf);
    if (!ok)
      return new absl::Status(
          absl::InternalError("cannot require TLS 1.3: " + pki::OpenSslError()));
    return new absl::Status();
  }();
  return *result;
}

void StructureGrpcLogs() {
  gpr_set_log_verbosity(GPR_LOG_SEVERITY_ERROR);
  gpr_set_log_function([](gpr_log_func_args* args) {
    std::string message = args->message ? args->message : "";
    for (char& c : message) {
      if (c == '"' || c == '\n') c = '\'';
    }
    const char* file = args->file ? std::strrchr(args->file, '/') : nullptr;
    std::fprintf(stderr, "level=%s event=grpc source=%s:%d message=\"%s\"\n",
                 args->severity == GPR_LOG_SEVERITY_ERROR ? "error" : "info",
                 file ? file + 1 : (args->file ? args->file : "?"), args->line, message.c_str());
  });
}

void VerificationLog::Record(std::string reason) {
  MutexLock lock(mu_);
  last_ = std::move(reason);
}

std::string VerificationLog::Last() const {
  MutexLock lock(mu_);
  return last_;
}

// gRPC's TLS credentials load the system's root store (/etc/ssl/certs: some 140 certificates
// parsed, about 30 ms of every start, most of process start to Welcome) unless they are handed
// roots. bcd never lets roots judge the gateway: gRPC's own verification is off and
// PinnedCaVerifier decides. So gRPC gets one self-signed certificate made at first use, whose key
// is dropped at once: it can vouch for nothing.
namespace {

const std::string& UnusedRootPem() {
  static const std::string* pem = [] {
    absl::StatusOr<pki::PrivateKey> key = pki::PrivateKey::Generate();
    if (!key.ok()) return new std::string();
    absl::StatusOr<pki::Certificate> cert =
        pki::IssueCertificate({.common_name = "bcd: unused root (the pinned CA decides)",
                               .not_before = 0,
                               .not_after = 1,
                               .is_ca = true},
                              key->Public(), *key, nullptr);
    return new std::string(cert.ok() ? cert->Pem() : "");
  }();
  return *pem;
}

}  // namespace

std::shared_ptr<grpc::Channel> MakeChannel(const ChannelSpec& spec) {
  grpc::experimental::TlsChannelCredentialsOptions options;
  std::vector<grpc::experimental::IdentityKeyCertPair> identity;
  if (spec.identity) identity.push_back({spec.identity->key_pem, spec.identity->chain_pem});
  const std::string& roots = UnusedRootPem();
  if (!roots.empty()) {
    options.set_certificate_provider(
        std::make_shared<grpc::experimental::StaticDataCertificateProvider>(roots, identity));
    options.watch_root_certs();
  } else if (spec.identity) {
    options.set_certificate_provider(
        std::make_shared<grpc::experimental::StaticDataCertificateProvider>(identity));
  }
  if (spec.identity) options.watch_identity_key_cert_pairs();
  // No root store at all: the pinned-CA verifier is the only judge of the server.
  options.set_verify_server_certs(false);
  options.set_check_call_host(false);
  options.set_certificate_verifier(
      grpc::experimental::ExternalCertificateVerifier::Create<PinnedCaVerifier>(
          spec.ca_spki_sha256, spec.server_name, spec.log, spec.now));
  grpc::ChannelArguments args;
  args.SetSslTargetNameOverride(spec.server_name);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, static_cast<int>(spec.keepalive_time.count()));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, static_cast<int>(spec.keepalive_timeout.count()));
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // Bounded memory, and a session that tunnel load never ends. What the gateway may send ahead
  // of bcd's reading is a fixed 1 MiB window per stream (17 streams at most: 17 MiB), far inside
  // the quota: gRPC ends a random stream of the connection ("Buffers full") when its quota runs
  // out, and that could be the session. Bandwidth-delay probing is off because it grows the
  // windows with throughput (several MiB each under load; 16 tunnels at full speed then filled
  // the quota and ended the session). A tunnel whose end stops reading stops the gateway's
  // sending at 1 MiB.
  static grpc::ResourceQuota* quota = [] {
    auto* q = new grpc::ResourceQuota("bcd-transport");
    q->Resize(32 << 20);
    return q;
  }();
  args.SetResourceQuota(*quota);
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 1 << 20);
  // The session engine owns reconnection and its backoff.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 1000);
  return grpc::CreateCustomChannel(spec.target, grpc::experimental::TlsCredentials(options), args);
}

std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(const ServerTlsSpec& spec) {
  auto provider = std::make_shared<grpc::experimental::StaticDataCertificateProvider>(
      spec.client_ca_pem,
      std::vector<grpc::experimental::IdentityKeyCertPair>{{spec.key_pem, spec.chain_pem}});
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_root_certs();
  options.watch_identity_key_cert_pairs();
  options.set_cert_request_type(spec.require_client_cert
                                    ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                                    : GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
  return grpc::experimental::TlsServerCredentials(options);
}

void ConfigureServerKeepalive(grpc::ServerBuilder* builder) {
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10000);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
}

}  // namespace bcd::transport
