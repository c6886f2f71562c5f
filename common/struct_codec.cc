#include "common/struct_codec.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/validation.h"

namespace shardcache {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::ListValue;
using google::protobuf::Message;
using google::protobuf::Reflection;
using google::protobuf::Struct;
using google::protobuf::Value;

// The largest magnitude below which every integer is exact in a double.
constexpr int64_t kMaxExactDouble = int64_t{1} << 53;

bool IsNull(const Value& v) {
  return v.kind_case() == Value::kNullValue || v.kind_case() == Value::KIND_NOT_SET;
}

// What a field's JSON value must be, for error messages.
std::string Expected(const FieldDescriptor* f, bool element) {
  if (!element && f->is_map()) {
    const FieldDescriptor* value = f->message_type()->map_value();
    return value->type() == FieldDescriptor::TYPE_STRING ? "an object of strings" : "an object";
  }
  if (!element && f->is_repeated()) {
    return f->type() == FieldDescriptor::TYPE_STRING ? "a list of strings" : "a list";
  }
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_STRING:
      return "a string";
    case FieldDescriptor::CPPTYPE_BOOL:
      return "a boolean";
    case FieldDescriptor::CPPTYPE_DOUBLE:
    case FieldDescriptor::CPPTYPE_FLOAT:
      return "a number";
    case FieldDescriptor::CPPTYPE_MESSAGE:
      return "an object";
    default:
      return "an integer";
  }
}

// An integer from a whole JSON number or a decimal string, within [min, max].
template <typename T>
bool ReadInteger(const Value& v, T* out) {
  if (v.kind_case() == Value::kStringValue) return absl::SimpleAtoi(v.string_value(), out);
  if (v.kind_case() != Value::kNumberValue) return false;
  double d = v.number_value();
  if (!std::isfinite(d) || std::floor(d) != d) return false;
  // The bounds as doubles: min is exact; max of a 64-bit type rounds up to 2^63 or 2^64, which
  // is itself out of range.
  const double min = static_cast<double>(std::numeric_limits<T>::min());
  const double max = static_cast<double>(std::numeric_limits<T>::max());
  if (d < min || (sizeof(T) == 8 ? d >= max : d > max)) return false;
  *out = static_cast<T>(d);
  return true;
}

absl::Status ReadMessage(const Struct& in, absl::string_view path, Message* out,
                         const StructCodecOptions& options);

bool HasJsonField(const Descriptor* d, absl::string_view json_name) {
  for (int i = 0; i < d->field_count(); ++i) {
    if (d->field(i)->json_name() == json_name) return true;
  }
  return false;
}

// One value (a singular field, a list element or a map value) into `out` at field `f`
// (repeated: added; singular: set).
absl::Status ReadValue(const Value& v, const FieldDescriptor* f, const std::string& path,
                       Message* out, const StructCodecOptions& options) {
  const Reflection* r = out->GetReflection();
  const bool add = f->is_repeated();
  auto wrong = [&] { return WrongJsonType(path, v, Expected(f, true)); };
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_STRING:
      if (v.kind_case() != Value::kStringValue) return wrong();
      add ? r->AddString(out, f, v.string_value()) : r->SetString(out, f, v.string_value());
      return absl::OkStatus();
    case FieldDescriptor::CPPTYPE_BOOL:
      if (v.kind_case() != Value::kBoolValue) return wrong();
      add ? r->AddBool(out, f, v.bool_value()) : r->SetBool(out, f, v.bool_value());
      return absl::OkStatus();
    case FieldDescriptor::CPPTYPE_DOUBLE:
      if (v.kind_case() != Value::kNumberValue) return wrong();
      add ? r->AddDouble(out, f, v.number_value()) : r->SetDouble(out, f, v.number_value());
      return absl::OkStatus();
    case FieldDescriptor::CPPTYPE_FLOAT: {
      if (v.kind_case() != Value::kNumberValue) return wrong();
      float x = static_cast<float>(v.number_value());
      add ? r->AddFloat(out, f, x) : r->SetFloat(out, f, x);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_INT64: {
      int64_t x;
      if (!ReadInteger(v, &x)) return wrong();
      add ? r->AddInt64(out, f, x) : r->SetInt64(out, f, x);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_UINT64: {
      uint64_t x;
      if (!ReadInteger(v, &x)) return wrong();
      add ? r->AddUInt64(out, f, x) : r->SetUInt64(out, f, x);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_INT32: {
      int32_t x;
      if (!ReadInteger(v, &x)) return wrong();
      add ? r->AddInt32(out, f, x) : r->SetInt32(out, f, x);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_UINT32: {
      uint32_t x;
      if (!ReadInteger(v, &x)) return wrong();
      add ? r->AddUInt32(out, f, x) : r->SetUInt32(out, f, x);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_MESSAGE: {
      const Descriptor* type = f->message_type();
      if (type == Value::descriptor()) {
        (add ? r->AddMessage(out, f) : r->MutableMessage(out, f))->CopyFrom(v);
        return absl::OkStatus();
      }
      if (type == ListValue::descriptor()) {
        if (v.kind_case() != Value::kListValue) return WrongJsonType(path, v, "a list");
        (add ? r->AddMessage(out, f) : r->MutableMessage(out, f))->CopyFrom(v.list_value());
        return absl::OkStatus();
      }
      if (v.kind_case() != Value::kStructValue) return wrong();
      Message* child = add ? r->AddMessage(out, f) : r->MutableMessage(out, f);
      if (type == Struct::descriptor()) {
        child->CopyFrom(v.struct_value());
        return absl::OkStatus();
      }
      return ReadMessage(v.struct_value(), path, child, options);
    }
    default:
      return absl::InternalError(absl::StrCat(path, ": unsupported field type"));
  }
}

absl::Status ReadMap(const Struct& in, const FieldDescriptor* f, const std::string& path,
                     Message* out, const StructCodecOptions& options) {
  const FieldDescriptor* key_field = f->message_type()->map_key();
  const FieldDescriptor* value_field = f->message_type()->map_value();
  std::vector<const std::string*> keys;
  for (const auto& [key, value] : in.fields()) keys.push_back(&key);
  std::sort(keys.begin(), keys.end(), [](auto* a, auto* b) { return *a < *b; });
  const Reflection* r = out->GetReflection();
  for (const std::string* key : keys) {
    Message* entry = r->AddMessage(out, f);
    entry->GetReflection()->SetString(entry, key_field, *key);
    absl::Status s =
        ReadValue(in.fields().at(*key), value_field, KeyPath(path, *key), entry, options);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status ReadMessage(const Struct& in, absl::string_view path, Message* out,
                         const StructCodecOptions& options) {
  out->Clear();
  const Descriptor* d = out->GetDescriptor();
  const bool strict = !options.ignore_unknown_fields ||
                      std::find(options.strict_messages.begin(), options.strict_messages.end(),
                                d) != options.strict_messages.end();
  if (strict) {
    std::vector<absl::string_view> unknown;
    for (const auto& [name, value] : in.fields()) {
      if (!HasJsonField(d, name)) unknown.push_back(name);
    }
    if (!unknown.empty()) {
      std::vector<std::string> known;
      for (int i = 0; i < d->field_count(); ++i) known.push_back(d->field(i)->json_name());
      std::sort(known.begin(), known.end());
      for (std::string& k : known) k = QuoteForMessage(k);
      return FieldForbidden(
          ChildPath(path, *std::min_element(unknown.begin(), unknown.end())),
          absl::StrCat("unknown field; the known fields are ", absl::StrJoin(known, ", ")));
    }
  }
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    auto it = in.fields().find(f->json_name());
    if (it == in.fields().end() || IsNull(it->second)) continue;
    const Value& v = it->second;
    const std::string field_path = ChildPath(path, f->json_name());
    if (f->is_map()) {
      if (v.kind_case() != Value::kStructValue) {
        return WrongJsonType(field_path, v, Expected(f, false));
      }
      absl::Status s = ReadMap(v.struct_value(), f, field_path, out, options);
      if (!s.ok()) return s;
    } else if (f->is_repeated()) {
      if (v.kind_case() != Value::kListValue) {
        return WrongJsonType(field_path, v, Expected(f, false));
      }
      const auto& list = v.list_value().values();
      for (int j = 0; j < list.size(); ++j) {
        absl::Status s =
            ReadValue(list[j], f, IndexPath(field_path, static_cast<size_t>(j)), out, options);
        if (!s.ok()) return s;
      }
    } else {
      absl::Status s = ReadValue(v, f, field_path, out, options);
      if (!s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

template <typename T>
Value IntegerValue(T x) {
  Value v;
  bool exact = x <= static_cast<T>(kMaxExactDouble) &&
               (std::numeric_limits<T>::min() == 0 || x >= static_cast<T>(-kMaxExactDouble));
  if (exact) {
    v.set_number_value(static_cast<double>(x));
  } else {
    v.set_string_value(absl::StrCat(x));
  }
  return v;
}

Value WriteValue(const Message& m, const FieldDescriptor* f, int index) {
  const Reflection* r = m.GetReflection();
  const bool rep = index >= 0;
  Value v;
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_STRING:
      v.set_string_value(rep ? r->GetRepeatedString(m, f, index) : r->GetString(m, f));
      break;
    case FieldDescriptor::CPPTYPE_BOOL:
      v.set_bool_value(rep ? r->GetRepeatedBool(m, f, index) : r->GetBool(m, f));
      break;
    case FieldDescriptor::CPPTYPE_DOUBLE:
      v.set_number_value(rep ? r->GetRepeatedDouble(m, f, index) : r->GetDouble(m, f));
      break;
    case FieldDescriptor::CPPTYPE_FLOAT:
      v.set_number_value(rep ? r->GetRepeatedFloat(m, f, index) : r->GetFloat(m, f));
      break;
    case FieldDescriptor::CPPTYPE_INT64:
      v = IntegerValue(rep ? r->GetRepeatedInt64(m, f, index) : r->GetInt64(m, f));
      break;
    case FieldDescriptor::CPPTYPE_UINT64:
      v = IntegerValue(rep ? r->GetRepeatedUInt64(m, f, index) : r->GetUInt64(m, f));
      break;
    case FieldDescriptor::CPPTYPE_INT32:
      v.set_number_value(rep ? r->GetRepeatedInt32(m, f, index) : r->GetInt32(m, f));
      break;
    case FieldDescriptor::CPPTYPE_UINT32:
      v.set_number_value(rep ? r->GetRepeatedUInt32(m, f, index) : r->GetUInt32(m, f));
      break;
    case FieldDescriptor::CPPTYPE_ENUM:
      v.set_number_value(rep ? r->GetRepeatedEnumValue(m, f, index) : r->GetEnumValue(m, f));
      break;
    case FieldDescriptor::CPPTYPE_MESSAGE: {
      const Message& child = rep ? r->GetRepeatedMessage(m, f, index) : r->GetMessage(m, f);
      const Descriptor* type = f->message_type();
      if (type == Value::descriptor()) {
        v.CopyFrom(child);
      } else if (type == ListValue::descriptor()) {
        v.mutable_list_value()->CopyFrom(child);
      } else if (type == Struct::descriptor()) {
        v.mutable_struct_value()->CopyFrom(child);
      } else {
        *v.mutable_struct_value() = MessageToStruct(child);
      }
      break;
    }
  }
  return v;
}

}  // namespace

std::string RenderJsonValue(const Value& v) {
  switch (v.kind_case()) {
    case Value::kStringValue:
      return QuoteForMessage(v.string_value());
    case Value::kNumberValue:
      return absl::StrCat(v.number_value());
    case Value::kBoolValue:
      return v.bool_value() ? "true" : "false";
    case Value::kStructValue:
      return "{...}";
    case Value::kListValue:
      return "[...]";
    default:
      return "null";
  }
}

absl::Status WrongJsonType(absl::string_view path, const Value& value, absl::string_view expected) {
  return FieldInvalidRendered(path, RenderJsonValue(value), absl::StrCat("must be ", expected));
}

absl::Status StructToMessage(const Struct& in, absl::string_view path, Message* out,
                             const StructCodecOptions& options) {
  return ReadMessage(in, path, out, options);
}

Struct MessageToStruct(const Message& in) {
  Struct out;
  const Descriptor* d = in.GetDescriptor();
  const Reflection* r = in.GetReflection();
  auto& fields = *out.mutable_fields();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (f->is_map()) {
      if (r->FieldSize(in, f) == 0) continue;
      Struct& map = *fields[f->json_name()].mutable_struct_value();
      const FieldDescriptor* key_field = f->message_type()->map_key();
      const FieldDescriptor* value_field = f->message_type()->map_value();
      for (int j = 0; j < r->FieldSize(in, f); ++j) {
        const Message& entry = r->GetRepeatedMessage(in, f, j);
        (*map.mutable_fields())[entry.GetReflection()->GetString(entry, key_field)] =
            WriteValue(entry, value_field, -1);
      }
    } else if (f->is_repeated()) {
      if (r->FieldSize(in, f) == 0) continue;
      ListValue& list = *fields[f->json_name()].mutable_list_value();
      for (int j = 0; j < r->FieldSize(in, f); ++j) *list.add_values() = WriteValue(in, f, j);
    } else if (r->HasField(in, f)) {
      fields[f->json_name()] = WriteValue(in, f, -1);
    }
  }
  return out;
}

}  // namespace shardcache
