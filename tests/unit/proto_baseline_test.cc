// The frozen packages (common/v1, agent/v1) may only grow: every field, enum value, message and
// method of proto/baseline.binpb must still be there with the same number, name, type and label.

#include <fstream>
#include <sstream>

#include "bettercompute/agent/v1/session.pb.h"
#include "gmock/gmock.h"
#include "google/protobuf/descriptor.h"
#include "gtest/gtest.h"
#include "tests/unit/proto_compat.h"

namespace bcd::testing {
namespace {

using google::protobuf::FieldDescriptorProto;
using google::protobuf::FileDescriptorSet;
using ::testing::ElementsAre;
using ::testing::IsEmpty;

const std::vector<std::string> kFrozen = {"bettercompute.common.v1", "bettercompute.agent.v1"};

FileDescriptorSet Baseline() {
  std::ifstream file(std::string(BCD_SOURCE_DIR) + "/proto/baseline.binpb", std::ios::binary);
  std::stringstream bytes;
  bytes << file.rdbuf();
  FileDescriptorSet set;
  EXPECT_TRUE(set.ParseFromString(bytes.str())) << "proto/baseline.binpb does not parse";
  return set;
}

// The descriptors compiled into this binary, for every file the baseline has.
FileDescriptorSet Current(const FileDescriptorSet& baseline) {
  bettercompute::agent::v1::AgentFrame link_generated_code;  // keeps the generated files linked
  (void)link_generated_code;
  FileDescriptorSet set;
  for (const auto& file : baseline.file()) {
    const auto* descriptor =
        google::protobuf::DescriptorPool::generated_pool()->FindFileByName(file.name());
    if (descriptor) descriptor->CopyTo(set.add_file());
  }
  return set;
}

FieldDescriptorProto* FindField(FileDescriptorSet* set, const std::string& message,
                                const std::string& field) {
  for (auto& file : *set->mutable_file()) {
    for (auto& m : *file.mutable_message_type()) {
      if (m.name() != message) continue;
      for (auto& f : *m.mutable_field()) {
        if (f.name() == field) return &f;
      }
    }
  }
  ADD_FAILURE() << message << "." << field << " not found";
  static FieldDescriptorProto none;
  return &none;
}

TEST(ProtoBaseline, CurrentProtosKeepEveryFrozenElement) {
  FileDescriptorSet baseline = Baseline();
  ASSERT_GT(baseline.file_size(), 0);
  EXPECT_THAT(BreakingChanges(baseline, Current(baseline), kFrozen), IsEmpty());
}

TEST(ProtoBaseline, PinnedFieldNumbersAreInTheBaseline) {
  FileDescriptorSet baseline = Baseline();
  EXPECT_EQ(FindField(&baseline, "Hello", "approver_set_epoch")->number(), 18);
  EXPECT_EQ(FindField(&baseline, "Hello", "approver_set_sha256")->number(), 19);
  EXPECT_EQ(FindField(&baseline, "StatusReport", "approver_set_epoch")->number(), 10);
  EXPECT_EQ(FindField(&baseline, "StatusReport", "approver_set_sha256")->number(), 11);
  EXPECT_EQ(FindField(&baseline, "TrustBundle", "approver_set_epoch")->number(), 8);
}

TEST(ProtoBaseline, FlagsARemovedField) {
  FileDescriptorSet baseline = Baseline();
  FileDescriptorSet current = baseline;
  for (auto& file : *current.mutable_file()) {
    for (auto& m : *file.mutable_message_type()) {
      if (m.name() == "Ack") m.mutable_field()->RemoveLast();
    }
  }
  EXPECT_THAT(BreakingChanges(baseline, current, kFrozen),
              ElementsAre("bettercompute.agent.v1.Ack: field 1 (up_to_seq) was removed"));
}

TEST(ProtoBaseline, FlagsARenumberedField) {
  FileDescriptorSet baseline = Baseline();
  FileDescriptorSet current = baseline;
  FindField(&current, "Hello", "approver_set_epoch")->set_number(20);
  EXPECT_THAT(BreakingChanges(baseline, current, kFrozen),
              ElementsAre("bettercompute.agent.v1.Hello: field approver_set_epoch was renumbered "
                          "from 18 to 20"));
}

TEST(ProtoBaseline, FlagsARetypedField) {
  FileDescriptorSet baseline = Baseline();
  FileDescriptorSet current = baseline;
  FindField(&current, "TrustBundle", "version")->set_type(FieldDescriptorProto::TYPE_UINT32);
  EXPECT_THAT(BreakingChanges(baseline, current, kFrozen),
              ElementsAre("bettercompute.agent.v1.TrustBundle: field 2 (version) changed type "
                          "from TYPE_UINT64 to TYPE_UINT32"));
}

TEST(ProtoBaseline, FlagsAFieldMadeRepeated) {
  FileDescriptorSet baseline = Baseline();
  FileDescriptorSet current = baseline;
  FindField(&current, "Command", "kind")->set_label(FieldDescriptorProto::LABEL_REPEATED);
  EXPECT_THAT(BreakingChanges(baseline, current, kFrozen),
              ElementsAre("bettercompute.agent.v1.Command: field 3 (kind) changed from singular "
                          "to repeated"));
}

TEST(ProtoBaseline, FlagsAChangedMessageType) {
  FileDescriptorSet baseline = Baseline();
  FileDescriptorSet current = baseline;
  FindField(&current, "Welcome", "trust")->set_type_name(".bettercompute.agent.v1.TrustBundle");
  EXPECT_THAT(BreakingChanges(baseline, current, kFrozen),
              ElementsAre("bettercompute.agent.v1.Welcome: field 4 (trust) changed type from "
                          "TYPE_MESSAGE .bettercompute.agent.v1.SignedTrustBundle to TYPE_MESSAGE "
                          ".bettercompute.agent.v1.TrustBundle"));
}

TEST(ProtoBaseline, FlagsARemovedEnumValueAndMethod) {
  FileDescriptorSet baseline = Baseline();
  FileDescriptorSet current = baseline;
  for (auto& file : *current.mutable_file()) {
    for (auto& e : *file.mutable_enum_type()) {
      if (e.name() == "CommandState") e.mutable_value()->RemoveLast();
    }
    for (auto& s : *file.mutable_service()) s.mutable_method()->RemoveLast();
  }
  EXPECT_THAT(BreakingChanges(baseline, current, kFrozen),
              ElementsAre("bettercompute.agent.v1.CommandState: value 7 (COMMAND_STATE_CANCELLED) "
                          "was removed or renumbered",
                          "bettercompute.agent.v1.AgentGateway.Tunnel: method was removed"));
}

TEST(ProtoBaseline, IgnoresDraftPackagesAndAdditions) {
  FileDescriptorSet baseline = Baseline();
  FileDescriptorSet current = baseline;
  for (auto& file : *current.mutable_file()) {
    if (file.package() == "bettercompute.site.v1") file.clear_message_type();
    for (auto& m : *file.mutable_message_type()) {
      if (m.name() == "Hello") {
        auto* added = m.add_field();
        added->set_name("new_field");
        added->set_number(30);
        added->set_type(FieldDescriptorProto::TYPE_STRING);
      }
    }
  }
  EXPECT_THAT(BreakingChanges(baseline, current, kFrozen), IsEmpty());
}

}  // namespace
}  // namespace bcd::testing
