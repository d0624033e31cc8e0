#include "io/json_fields.h"

#include <cmath>
#include <sstream>

namespace cedar {
namespace {

const nlohmann::json& empty_object() {
  static const nlohmann::json kEmpty = nlohmann::json::object();
  return kEmpty;
}

std::string fmt_double(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

bool as_int(const nlohmann::json& v, int64_t* out) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
    *out = static_cast<int64_t>(u);
    return true;
  }
  if (v.is_number_integer()) {
    *out = v.get<int64_t>();
    return true;
  }
  return false;
}

}  // namespace

std::string describe_json(const nlohmann::json& v) {
  switch (v.type()) {
    case nlohmann::json::value_t::null: return "null";
    case nlohmann::json::value_t::boolean: return std::string("boolean ") + (v.get<bool>() ? "true" : "false");
    case nlohmann::json::value_t::string: return "string " + v.dump();
    case nlohmann::json::value_t::array: return "an array";
    case nlohmann::json::value_t::object: return "an object";
    case nlohmann::json::value_t::number_float: return "number " + fmt_double(v.get<double>());
    default: return "number " + v.dump();
  }
}

const nlohmann::json* JsonFields::find(JsonKey key, std::string* found_name) const {
  for (std::string_view k : {key.primary, key.alias}) {
    if (k.empty()) continue;
    auto it = object_.find(std::string(k));
    if (it == object_.end() || it->is_null()) continue;
    if (found_name) *found_name = std::string(k);
    return &*it;
  }
  return nullptr;
}

void JsonFields::error(std::string_view key, const std::string& what) const {
  errors_->push_back(name(key) + ": " + what);
}

namespace {

// Shared prologue of every read: resolves the key, reports a missing required field.
struct Lookup {
  const nlohmann::json* value = nullptr;
  std::string key;
};

Lookup lookup(const JsonFields& f, JsonKey key, Need need) {
  Lookup l;
  if (key.primary.empty()) return l;
  l.value = f.find(key, &l.key);
  if (!l.value && need == Need::Required) {
    std::string what = "required field is missing";
    if (!key.alias.empty()) what += " (also accepted: '" + std::string(key.alias) + "')";
    f.error(key.primary, what);
  }
  return l;
}

}  // namespace

void JsonFields::read_int(JsonKey key, int64_t* out, Need need, int64_t lo, int64_t hi) {
  const Lookup l = lookup(*this, key, need);
  if (!l.value) return;
  int64_t v = 0;
  if (!as_int(*l.value, &v)) {
    error(l.key, "expected an integer, got " + describe_json(*l.value));
    return;
  }
  if (v < lo || v > hi) {
    std::string range = v < lo ? "must be >= " + std::to_string(lo) : "must be <= " + std::to_string(hi);
    error(l.key, range + ", got " + std::to_string(v));
    return;
  }
  *out = v;
}

void JsonFields::read_double(JsonKey key, double* out, Need need, double lo, double hi) {
  const Lookup l = lookup(*this, key, need);
  if (!l.value) return;
  if (!l.value->is_number()) {
    error(l.key, "expected a number, got " + describe_json(*l.value));
    return;
  }
  const double v = l.value->get<double>();
  if (!std::isfinite(v) || v < lo || v > hi) {
    std::string range = v < lo ? "must be >= " + fmt_double(lo) : "must be <= " + fmt_double(hi);
    if (!std::isfinite(v)) range = "must be finite";
    error(l.key, range + ", got " + fmt_double(v));
    return;
  }
  *out = v;
}

void JsonFields::read_bool(JsonKey key, bool* out, Need need) {
  const Lookup l = lookup(*this, key, need);
  if (!l.value) return;
  if (!l.value->is_boolean()) {
    error(l.key, "expected true or false, got " + describe_json(*l.value));
    return;
  }
  *out = l.value->get<bool>();
}

void JsonFields::read_string(JsonKey key, std::string* out, Need need,
                             std::initializer_list<std::string_view> allowed) {
  const Lookup l = lookup(*this, key, need);
  if (!l.value) return;
  if (!l.value->is_string()) {
    error(l.key, "expected a string, got " + describe_json(*l.value));
    return;
  }
  std::string v = l.value->get<std::string>();
  if (allowed.size() > 0) {
    bool ok = false;
    std::string list;
    for (std::string_view a : allowed) {
      ok = ok || a == v;
      list += (list.empty() ? "'" : ", '") + std::string(a) + "'";
    }
    if (!ok) {
      error(l.key, "unsupported value \"" + v + "\" (supported: " + list + ")");
      return;
    }
  }
  *out = std::move(v);
}

void JsonFields::read_int_list(JsonKey key, std::vector<int64_t>* out, Need need, int64_t lo, int64_t hi) {
  const Lookup l = lookup(*this, key, need);
  if (!l.value) return;
  if (!l.value->is_array()) {
    error(l.key, "expected a list of integers, got " + describe_json(*l.value));
    return;
  }
  std::vector<int64_t> values;
  for (size_t i = 0; i < l.value->size(); ++i) {
    int64_t v = 0;
    const auto& item = (*l.value)[i];
    const std::string where = "element " + std::to_string(i);
    if (!as_int(item, &v)) {
      error(l.key, where + ": expected an integer, got " + describe_json(item));
      return;
    }
    if (v < lo || v > hi) {
      std::string range = v < lo ? "must be >= " + std::to_string(lo) : "must be <= " + std::to_string(hi);
      error(l.key, where + ": " + range + ", got " + std::to_string(v));
      return;
    }
    values.push_back(v);
  }
  *out = std::move(values);
}

void JsonFields::read_int_or_first(JsonKey key, int64_t* out, Need need) {
  const Lookup l = lookup(*this, key, need);
  if (!l.value) return;
  const nlohmann::json* v = l.value;
  if (v->is_array()) {
    if (v->empty()) {
      error(l.key, "expected an integer or a non-empty list of integers, got an empty list");
      return;
    }
    v = &(*v)[0];
  }
  int64_t i = 0;
  if (!as_int(*v, &i)) {
    error(l.key, "expected an integer, got " + describe_json(*v));
    return;
  }
  *out = i;
}

JsonFields JsonFields::child(std::string_view key) const {
  auto it = object_.find(std::string(key));
  if (it != object_.end() && it->is_object()) return JsonFields(*it, name(key) + ".", errors_);
  if (it != object_.end() && !it->is_null()) error(key, "expected an object, got " + describe_json(*it));
  return JsonFields(empty_object(), name(key) + ".", errors_);
}

}  // namespace cedar
