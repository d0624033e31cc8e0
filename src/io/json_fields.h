// Typed, validated reads of JSON object fields that collect every problem instead of stopping at the
// first: a config with three wrong fields reports all three, each named by its full path
// ("text_config.hidden_size"). Used by the config parser; knows nothing about models.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace cedar {

// One field, under up to two accepted spellings (e.g. "engram_pad_token_id" / "engram_pad_id").
// An empty `primary` means "this field has no key in this format": reads do nothing.
struct JsonKey {
  std::string_view primary;
  std::string_view alias = {};
};

enum class Need { Required, Optional };

class JsonFields {
 public:
  // `object` must outlive this reader; `prefix` is prepended to key names in messages.
  JsonFields(const nlohmann::json& object, std::string prefix, std::vector<std::string>* errors)
      : object_(object), prefix_(std::move(prefix)), errors_(errors) {}

  // The value under the first spelling present; JSON null counts as absent.
  const nlohmann::json* find(JsonKey key, std::string* found_name = nullptr) const;
  bool has(JsonKey key) const { return find(key) != nullptr; }

  // Each read leaves *out untouched when the key is absent (the caller's default stays) and records
  // an error when a required key is missing, has the wrong type, or is outside [lo, hi].
  void read_int(JsonKey key, int64_t* out, Need need, int64_t lo = std::numeric_limits<int64_t>::min(),
                int64_t hi = std::numeric_limits<int64_t>::max());
  void read_double(JsonKey key, double* out, Need need, double lo = -std::numeric_limits<double>::infinity(),
                   double hi = std::numeric_limits<double>::infinity());
  void read_bool(JsonKey key, bool* out, Need need);
  // `allowed` empty: any string.
  void read_string(JsonKey key, std::string* out, Need need, std::initializer_list<std::string_view> allowed = {});
  void read_int_list(JsonKey key, std::vector<int64_t>* out, Need need,
                     int64_t lo = std::numeric_limits<int64_t>::min(),
                     int64_t hi = std::numeric_limits<int64_t>::max());
  // An int, or a list of ints whose first element is taken (HF allows a list for eos_token_id).
  void read_int_or_first(JsonKey key, int64_t* out, Need need);

  // Reader over a nested object; records an error (and returns a reader over an empty object) when
  // the key holds something else.
  JsonFields child(std::string_view key) const;

  std::string name(std::string_view key) const { return prefix_ + std::string(key); }
  void error(std::string_view key, const std::string& what) const;
  std::vector<std::string>* errors() const { return errors_; }

 private:
  const nlohmann::json& object_;
  std::string prefix_;
  std::vector<std::string>* errors_;
};

// "string \"abc\"", "array", "number 3.5", ... for messages.
std::string describe_json(const nlohmann::json& v);

}  // namespace cedar
