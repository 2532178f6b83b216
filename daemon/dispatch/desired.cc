#include "daemon/dispatch/desired.h"

#include "base/files.h"
#include "base/mutex.h"
#include "fmt/format.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/unknown_field_set.h"
#include "pki/envelope.h"
#include "proto/absl_compat.h"
#include "proto/frame_codec.h"
#include "proto/signing_input.h"

namespace bcd {

namespace v1 = bettercompute::agent::v1;

absl::StatusOr<std::unique_ptr<DesiredState>> DesiredState::Open(const std::filesystem::path& dir,
                                                                 std::string node_id, Logger* log) {
  std::unique_ptr<DesiredState> state(
      new DesiredState(dir / "spec.binpb", std::move(node_id), log));
  absl::StatusOr<std::string> bytes = ReadWholeFile(state->path_, 8u << 20);
  if (absl::IsNotFound(bytes.status())) return state;
  if (!bytes.ok()) return bytes.status();
  v1::SignedSpec signed_spec;
  if (absl::Status s = proto::DecodeMessage(*bytes, &signed_spec); !s.ok()) {
    return absl::DataLossError(fmt::format("{}: {}", state->path_.string(), ToStd(s.message())));
  }
  if (absl::Status s = proto::DecodeMessage(signed_spec.body(), &state->spec_); !s.ok()) {
    return absl::DataLossError(
        fmt::format("{}: the spec body: {}", state->path_.string(), ToStd(s.message())));
  }
  return state;
}

void DesiredState::Register(const std::string& section, Applier apply) {
  MutexLock lock(mu_);
  appliers_[section] = std::move(apply);
}

void DesiredState::Reapply() {
  MutexLock lock(mu_);
  if (spec_.generation() != 0) ApplyLocked(spec_);
}

v1::SpecAck DesiredState::Offer(const v1::SignedSpec& signed_spec, const pki::TrustState& trust,
                                int64_t now, bool signed_only) {
  v1::SpecAck ack;
  auto refuse = [&](std::string code, std::string message) {
    ack.set_state(v1::SPEC_ACK_STATE_REJECTED);
    ack.set_code(code);
    ack.set_message(message);
    log_->Warn("spec.refused", {{"generation", std::to_string(ack.generation())},
                                {"code", std::move(code)},
                                {"message", std::move(message)}});
    return ack;
  };
  v1::NodeSpec spec;
  if (absl::Status s = proto::DecodeMessage(signed_spec.body(), &spec); !s.ok()) {
    return refuse("INVALID", fmt::format("the spec does not decode: {}", ToStd(s.message())));
  }
  ack.set_generation(spec.generation());
  if (spec.node_id() != node_id_) {
    return refuse("WRONG_NODE", fmt::format("spec generation {} is for node \"{}\", this is \"{}\"",
                                            spec.generation(), spec.node_id(), node_id_));
  }
  if (signed_only && trust.command_signing_roots().empty()) {
    return refuse("BAD_SIGNATURE",
                  fmt::format("spec generation {}: this session takes only signed specs and the "
                              "trust bundle has no command-signing roots to verify them with",
                              spec.generation()));
  }
  if (!trust.command_signing_roots().empty()) {
    if (signed_spec.signature().sig().empty()) {
      return refuse("UNSIGNED", fmt::format("spec generation {} is not signed", spec.generation()));
    }
    if (absl::Status s =
            pki::VerifyWithChain(proto::BodySigningInput(proto::Purpose::kSpec, signed_spec.body()),
                                 signed_spec.signature(), trust.command_signing_roots(), now);
        !s.ok()) {
      return refuse("BAD_SIGNATURE", fmt::format("spec generation {}: signature: {}",
                                                 spec.generation(), ToStd(s.message())));
    }
  }
  MutexLock lock(mu_);
  if (spec.generation() <= spec_.generation()) {
    return refuse("STALE", fmt::format("spec generation {} is not newer than the applied {}",
                                       spec.generation(), spec_.generation()));
  }
  // Persist before applying: a crash in between applies it at the next start.
  if (absl::Status s = AtomicWriteFile(path_, signed_spec.SerializeAsString(), 0600); !s.ok()) {
    return refuse("NOT_PERSISTED", fmt::format("spec generation {} could not be persisted: {}",
                                               spec.generation(), ToStd(s.message())));
  }
  spec_ = spec;
  ApplyLocked(spec_);
  ack.set_state(v1::SPEC_ACK_STATE_APPLIED);
  for (const v1::SectionStatus& status : sections_) *ack.add_sections() = status;
  log_->Info("spec.applied", {{"generation", std::to_string(spec.generation())}});
  return ack;
}

void DesiredState::ApplyLocked(const v1::NodeSpec& spec) {
  sections_.clear();
  const google::protobuf::Descriptor* type = spec.GetDescriptor();
  const google::protobuf::Reflection* reflection = spec.GetReflection();
  for (int i = 0; i < type->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* field = type->field(i);
    if (field->message_type() == nullptr || !reflection->HasField(spec, field)) continue;
    v1::SectionStatus status;
    status.set_name(field->name());
    status.set_generation(spec.generation());
    auto applier = appliers_.find(field->name());
    if (applier == appliers_.end()) {
      status.set_state(v1::SECTION_STATE_UNSUPPORTED);
      status.set_message(
          fmt::format("this build does not implement the {} section", field->name()));
    } else if (absl::Status s = applier->second(spec); !s.ok()) {
      status.set_state(absl::IsFailedPrecondition(s) ? v1::SECTION_STATE_PENDING
                       : absl::IsUnimplemented(s)    ? v1::SECTION_STATE_UNSUPPORTED
                                                     : v1::SECTION_STATE_FAILED);
      status.set_message(std::string(ToStd(s.message())));
    } else {
      status.set_state(v1::SECTION_STATE_APPLIED);
    }
    log_->Info("spec.section", {{"generation", std::to_string(spec.generation())},
                                {"section", status.name()},
                                {"state", v1::SectionState_Name(status.state())},
                                {"message", status.message()}});
    sections_.push_back(std::move(status));
  }
  // Sections newer than this build arrive as unknown fields: say so rather than drop them.
  const google::protobuf::UnknownFieldSet& unknown = reflection->GetUnknownFields(spec);
  for (int i = 0; i < unknown.field_count(); ++i) {
    v1::SectionStatus status;
    status.set_name(fmt::format("field {}", unknown.field(i).number()));
    status.set_generation(spec.generation());
    status.set_state(v1::SECTION_STATE_UNSUPPORTED);
    status.set_message(fmt::format("a section this build does not know (NodeSpec field {})",
                                   unknown.field(i).number()));
    sections_.push_back(std::move(status));
  }
}

uint64_t DesiredState::applied_generation() const {
  MutexLock lock(mu_);
  return spec_.generation();
}

std::vector<v1::SectionStatus> DesiredState::sections() const {
  MutexLock lock(mu_);
  return sections_;
}

v1::NodeSpec DesiredState::applied() const {
  MutexLock lock(mu_);
  return spec_;
}

v1::AccessSection DesiredState::access() const {
  MutexLock lock(mu_);
  return spec_.access();
}

std::string DesiredState::tunnel_jwks() const {
  MutexLock lock(mu_);
  return spec_.access().tunnel_jwks();
}

}  // namespace bcd
