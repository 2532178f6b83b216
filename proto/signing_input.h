#pragma once

// The signing-input layout of agent/v1 signed envelopes:
//
//   input = "bettercompute.v1/" || purpose || 0x00 || part_1 || ... || part_n
//   part  = uint32_be(len(bytes)) || bytes
//
// One function per purpose fixes which parts it signs, in order, so a signer and a verifier cannot
// disagree about the layout. Pure byte work: no keys, no hashing (callers pass digests).

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

#include "bettercompute/agent/v1/secrets.pb.h"
#include "bettercompute/agent/v1/session.pb.h"
#include "bettercompute/agent/v1/trust.pb.h"

namespace bcd::proto {

enum class Purpose {
  kJoinResponse,   // "join-response": [body], by the JoinService key
  kTrustBundle,    // "trust-bundle": [body], by the JoinService key
  kApproverSet,    // "approver-set": [uint64_be(epoch), sha256(approverSetInput), trust_domain]
  kCommand,        // "command": [body], by a worker key
  kApprove,        // "approve": [sha256(body)] or [sha256(batch_manifest)], by approver keys
  kSpec,           // "spec": [body], by a worker key
  kSecretRequest,  // "secret-request": [ref, workflow_id, step_id, allocation_id, epk, request_id]
  kWorkloadToken,  // "workload-token": [request_id, instance_id, audience, epk]
  kRenew,          // "renew": [csr, uint64_be(timestamp), nonce, leaf DER], by the current node key
  kWsSession,      // "ws-session": [nonce, uint64_be(time), leaf DER, host], by the node key
  kGatewayProof,   // "gateway-proof": [body], by the gateway serving leaf
  kDiscovery,      // "discovery": [body], by the site agent's node key
  kRelease,        // "release": [version, os_arch, sha256 (32 raw bytes)], by a release key
};

// The purpose's token as it appears in the signing input ("join-response", ...).
std::string_view PurposeName(Purpose purpose);

// Big-endian encodings used as parts.
std::string Uint32Be(uint32_t value);
std::string Uint64Be(uint64_t value);

// The generic layout. Parts longer than 2^32-1 bytes cannot be represented; callers bound their
// inputs far below that (see frame_codec.h), and this aborts rather than truncate a length.
std::string SigningInput(Purpose purpose, std::initializer_list<std::string_view> parts);

// Purposes whose only part is the signed body: join-response, trust-bundle, command, spec,
// gateway-proof, discovery.
std::string BodySigningInput(Purpose purpose, std::string_view body);

std::string ApproverSetSigningInput(uint64_t approver_set_epoch,
                                    std::string_view approver_set_sha256,
                                    std::string_view trust_domain);
std::string ApproveSigningInput(std::string_view sha256_of_body_or_manifest);
// Covers every field of the request except node_sig.
std::string SecretRequestSigningInput(const bettercompute::agent::v1::SecretRequest& request);
// Covers every field of the request except node_sig.
std::string WorkloadTokenSigningInput(
    const bettercompute::agent::v1::WorkloadTokenRequest& request);
// Covers the request's csr, timestamp, nonce and chain[0] (the current leaf); empty leaf if no
// chain.
std::string RenewSigningInput(const bettercompute::agent::v1::RenewRequest& request);
std::string WsSessionSigningInput(std::string_view nonce, uint64_t time, std::string_view leaf_der,
                                  std::string_view host);
// A release (daemon.upgrade): its version, the os/arch it was built for ("linux/amd64") and the
// binary's sha256 as 32 raw bytes.
std::string ReleaseSigningInput(std::string_view version, std::string_view os_arch,
                                std::string_view sha256);

// approverSetInput: uint32_be(n), each approver key's SPKI DER in bundle order (as a part),
// uint32_be(approver_threshold), uint32_be(m), each tier's uint32_be(min_targets) ||
// uint32_be(threshold), then uint32_be(unbatched_destructive_per_hour); every item is a part
// (uint32_be(len) || bytes). Its sha256 is what Hello 19 and StatusReport 11 report.
std::string ApproverSetInput(const bettercompute::agent::v1::TrustBundle& bundle);

}  // namespace bcd::proto
