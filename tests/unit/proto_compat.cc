#include "tests/unit/proto_compat.h"

#include <map>

#include "fmt/format.h"

namespace bcd::testing {
namespace {

using google::protobuf::DescriptorProto;
using google::protobuf::EnumDescriptorProto;
using google::protobuf::FieldDescriptorProto;
using google::protobuf::FileDescriptorProto;
using google::protobuf::ServiceDescriptorProto;

std::string FieldType(const FieldDescriptorProto& field) {
  std::string type = FieldDescriptorProto::Type_Name(field.type());
  if (!field.type_name().empty()) type += " " + field.type_name();
  return type;
}

std::string FieldLabel(const FieldDescriptorProto& field) {
  if (field.label() == FieldDescriptorProto::LABEL_REPEATED) return "repeated";
  return field.proto3_optional() ? "optional" : "singular";
}

// The oneof a field belongs to, by name; "" when none (synthetic proto3-optional oneofs count as
// none).
std::string OneofOf(const DescriptorProto& message, const FieldDescriptorProto& field) {
  if (!field.has_oneof_index() || field.proto3_optional()) return "";
  return message.oneof_decl(field.oneof_index()).name();
}

class Checker {
 public:
  std::vector<std::string> problems;

  void File(const FileDescriptorProto& old_file, const FileDescriptorProto& new_file) {
    if (old_file.package() != new_file.package()) {
      Problem(old_file.name(),
              fmt::format("package changed from {} to {}", old_file.package(), new_file.package()));
    }
    std::string prefix = old_file.package();
    Messages(prefix, old_file.message_type(), new_file.message_type());
    Enums(prefix, old_file.enum_type(), new_file.enum_type());
    for (const ServiceDescriptorProto& old_service : old_file.service()) {
      const ServiceDescriptorProto* new_service = nullptr;
      for (const auto& s : new_file.service()) {
        if (s.name() == old_service.name()) new_service = &s;
      }
      std::string name = prefix + "." + old_service.name();
      if (!new_service) {
        Problem(name, "service was removed");
        continue;
      }
      Service(name, old_service, *new_service);
    }
  }

 private:
  void Problem(const std::string& where, const std::string& what) {
    problems.push_back(fmt::format("{}: {}", where, what));
  }

  template <typename List>
  static const typename List::value_type* ByName(const List& list, const std::string& name) {
    for (const auto& item : list) {
      if (item.name() == name) return &item;
    }
    return nullptr;
  }

  template <typename List>
  void Messages(const std::string& prefix, const List& old_list, const List& new_list) {
    for (const DescriptorProto& old_message : old_list) {
      std::string name = prefix + "." + old_message.name();
      const DescriptorProto* new_message = ByName(new_list, old_message.name());
      if (!new_message) {
        Problem(name, "message was removed");
        continue;
      }
      Message(name, old_message, *new_message);
    }
  }

  template <typename List>
  void Enums(const std::string& prefix, const List& old_list, const List& new_list) {
    for (const EnumDescriptorProto& old_enum : old_list) {
      std::string name = prefix + "." + old_enum.name();
      const EnumDescriptorProto* new_enum = ByName(new_list, old_enum.name());
      if (!new_enum) {
        Problem(name, "enum was removed");
        continue;
      }
      std::map<int, std::string> new_values;
      for (const auto& value : new_enum->value()) new_values[value.number()] = value.name();
      for (const auto& value : old_enum.value()) {
        auto it = new_values.find(value.number());
        if (it == new_values.end()) {
          Problem(name, fmt::format("value {} ({}) was removed or renumbered", value.number(),
                                    value.name()));
        } else if (it->second != value.name()) {
          Problem(name, fmt::format("value {} was renamed from {} to {}", value.number(),
                                    value.name(), it->second));
        }
      }
    }
  }

  void Message(const std::string& name, const DescriptorProto& old_message,
               const DescriptorProto& new_message) {
    std::map<int, const FieldDescriptorProto*> new_fields;
    for (const auto& field : new_message.field()) new_fields[field.number()] = &field;
    for (const FieldDescriptorProto& old_field : old_message.field()) {
      auto it = new_fields.find(old_field.number());
      if (it == new_fields.end()) {
        const FieldDescriptorProto* moved = ByName(new_message.field(), old_field.name());
        if (moved) {
          Problem(name, fmt::format("field {} was renumbered from {} to {}", old_field.name(),
                                    old_field.number(), moved->number()));
        } else {
          Problem(name,
                  fmt::format("field {} ({}) was removed", old_field.number(), old_field.name()));
        }
        continue;
      }
      const FieldDescriptorProto& new_field = *it->second;
      std::string field = fmt::format("field {} ({})", old_field.number(), old_field.name());
      if (new_field.name() != old_field.name()) {
        Problem(name, fmt::format("{} was renamed to {}", field, new_field.name()));
      }
      if (FieldType(new_field) != FieldType(old_field)) {
        Problem(name, fmt::format("{} changed type from {} to {}", field, FieldType(old_field),
                                  FieldType(new_field)));
      }
      if (FieldLabel(new_field) != FieldLabel(old_field)) {
        Problem(name, fmt::format("{} changed from {} to {}", field, FieldLabel(old_field),
                                  FieldLabel(new_field)));
      }
      if (OneofOf(new_message, new_field) != OneofOf(old_message, old_field)) {
        Problem(name,
                fmt::format("{} moved from oneof \"{}\" to \"{}\"", field,
                            OneofOf(old_message, old_field), OneofOf(new_message, new_field)));
      }
    }
    Messages(name, old_message.nested_type(), new_message.nested_type());
    Enums(name, old_message.enum_type(), new_message.enum_type());
  }

  void Service(const std::string& name, const ServiceDescriptorProto& old_service,
               const ServiceDescriptorProto& new_service) {
    for (const auto& old_method : old_service.method()) {
      const auto* new_method = ByName(new_service.method(), old_method.name());
      std::string method = name + "." + old_method.name();
      if (!new_method) {
        Problem(method, "method was removed");
        continue;
      }
      if (new_method->input_type() != old_method.input_type() ||
          new_method->output_type() != old_method.output_type()) {
        Problem(method, fmt::format("signature changed from ({}) -> ({}) to ({}) -> ({})",
                                    old_method.input_type(), old_method.output_type(),
                                    new_method->input_type(), new_method->output_type()));
      }
      if (new_method->client_streaming() != old_method.client_streaming() ||
          new_method->server_streaming() != old_method.server_streaming()) {
        Problem(method, "streaming changed");
      }
    }
  }
};

bool Frozen(const std::string& package, const std::vector<std::string>& prefixes) {
  for (const std::string& prefix : prefixes) {
    if (package.starts_with(prefix)) return true;
  }
  return false;
}

}  // namespace

std::vector<std::string> BreakingChanges(const google::protobuf::FileDescriptorSet& baseline,
                                         const google::protobuf::FileDescriptorSet& current,
                                         const std::vector<std::string>& frozen_package_prefixes) {
  Checker checker;
  for (const FileDescriptorProto& old_file : baseline.file()) {
    if (!Frozen(old_file.package(), frozen_package_prefixes)) continue;
    const FileDescriptorProto* new_file = nullptr;
    for (const auto& f : current.file()) {
      if (f.name() == old_file.name()) new_file = &f;
    }
    if (!new_file) {
      checker.problems.push_back(fmt::format("{}: file was removed", old_file.name()));
      continue;
    }
    checker.File(old_file, *new_file);
  }
  return checker.problems;
}

}  // namespace bcd::testing
