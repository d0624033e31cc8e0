// parse_safetensors: validation of one safetensors file image. The JSON header is read through
// nlohmann's SAX interface straight into TensorEntry values: no DOM, header order kept, duplicate
// fields and deep nesting caught, and no exceptions (a handler returning false stops the parser).
#include <algorithm>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string_view>
#include <unordered_set>

#include "io/safetensors.h"

namespace cedar::io {

bool supported_for_weights(DType t) {
  switch (t) {
    case DType::BF16:
    case DType::F16:
    case DType::F32:
    case DType::F8_E4M3:
    case DType::F8_E8M0:
    case DType::I8:
      return true;
    default:
      return false;
  }
}

std::string_view supported_weight_dtypes() { return "BF16, F16, F32, F8_E4M3, F8_E8M0, I8"; }

int64_t TensorEntry::numel() const {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<int64_t>());
}

namespace {

using json = nlohmann::json;

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string offsets_text(uint64_t begin, uint64_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + "]";
}

// One JSON scalar as the parser reported it; described (lazily, for error messages only) as written.
struct Scalar {
  enum Kind { kNull, kBool, kUnsigned, kNegative, kFloat, kString, kBinary } kind;
  uint64_t unsigned_value = 0;
  int64_t negative_value = 0;
  const std::string* float_text = nullptr;
  std::string* string_value = nullptr;  // kString only; the parser lets us move from it

  std::string describe() const {
    switch (kind) {
      case kNull: return "null";
      case kBool: return "a boolean";
      case kUnsigned: return std::to_string(unsigned_value);
      case kNegative: return std::to_string(negative_value);
      case kFloat: return *float_text;
      case kString: return "a string";
      case kBinary: return "binary data";
    }
    return "a value";
  }
};

enum class Field : uint8_t { kDType = 1, kShape = 2, kOffsets = 4, kUnknown = 8 };

class HeaderSax {
 public:
  HeaderSax(const std::string& label, SafetensorsHeader& out) : label_(label), out_(out) {}

  // --- nlohmann SAX interface ---
  bool null() { return scalar({Scalar::kNull, 0, 0, nullptr, nullptr}); }
  bool boolean(bool) { return scalar({Scalar::kBool, 0, 0, nullptr, nullptr}); }
  bool number_integer(json::number_integer_t v) {
    if (v >= 0) return number_unsigned(static_cast<uint64_t>(v));  // "-0"
    return scalar({Scalar::kNegative, 0, v, nullptr, nullptr});
  }
  bool number_unsigned(json::number_unsigned_t v) { return scalar({Scalar::kUnsigned, v, 0, nullptr, nullptr}); }
  bool number_float(json::number_float_t, const std::string& text) {
    return scalar({Scalar::kFloat, 0, 0, &text, nullptr});
  }
  bool string(std::string& s) { return scalar({Scalar::kString, 0, 0, nullptr, &s}); }
  bool binary(json::binary_t&) { return scalar({Scalar::kBinary, 0, 0, nullptr, nullptr}); }
  bool start_object(std::size_t) { return start_container(true); }
  bool start_array(std::size_t) { return start_container(false); }
  bool end_object() { return end_container(); }
  bool end_array() { return end_container(); }
  bool key(std::string& k);
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& ex) {
    std::string what = ex.what();
    if (auto close = what.find("] "); what.rfind("[json.exception", 0) == 0 && close != std::string::npos)
      what = what.substr(close + 2);
    if (what.size() > 300) what = what.substr(0, 300) + "…";  // "last read" can quote a whole long token
    std::string where = in_entry() ? " (in tensor '" + name_ + "')" : "";
    return fail("invalid JSON in header" + where + ": " + what);
  }

  const std::string& error() const { return error_; }

 private:
  enum class State { kStart, kTopKey, kTopValue, kMetaKey, kMetaValue, kEntryKey, kEntryValue, kShape, kOffsets,
                     kSkip, kEnd };

  bool fail(const std::string& message) {
    if (error_.empty()) error_ = label_ + ": " + message;
    return false;
  }
  bool fail_tensor(const std::string& message) { return fail("tensor '" + name_ + "': " + message); }
  bool internal() { return fail("unexpected JSON structure in header"); }  // the parser guarantees key/value order
  bool in_entry() const {
    return state_ == State::kEntryKey || state_ == State::kEntryValue || state_ == State::kShape ||
           state_ == State::kOffsets || state_ == State::kSkip || (state_ == State::kTopValue && !is_metadata_);
  }
  const char* field_name() const {
    switch (field_) {
      case Field::kDType: return "dtype";
      case Field::kShape: return "shape";
      case Field::kOffsets: return "data_offsets";
      case Field::kUnknown: break;
    }
    return "?";
  }

  bool scalar(const Scalar& s);
  bool start_container(bool is_object);
  bool end_container();
  bool finish_entry();

  const std::string& label_;
  SafetensorsHeader& out_;
  std::string error_;
  State state_ = State::kStart;
  int depth_ = 0;
  int skip_depth_ = 0;  // nesting inside an unknown entry field (ignored, as the official crate does)
  bool is_metadata_ = false, seen_metadata_ = false;
  std::string name_;      // current top-level key
  std::string meta_key_;  // current "__metadata__" key
  // The entry being read.
  Field field_ = Field::kUnknown;
  uint8_t seen_fields_ = 0;
  std::string dtype_name_;
  TensorEntry entry_;
  size_t n_offsets_ = 0;
};

bool HeaderSax::key(std::string& k) {
  switch (state_) {
    case State::kTopKey:
      name_ = std::move(k);
      is_metadata_ = name_ == "__metadata__";
      if (is_metadata_ && seen_metadata_) return fail("\"__metadata__\" appears twice in the header");
      seen_metadata_ = seen_metadata_ || is_metadata_;
      state_ = State::kTopValue;
      return true;
    case State::kMetaKey:
      if (out_.metadata.count(k)) return fail("\"__metadata__\" has key '" + k + "' twice");
      meta_key_ = std::move(k);
      state_ = State::kMetaValue;
      return true;
    case State::kEntryKey: {
      field_ = k == "dtype" ? Field::kDType
               : k == "shape" ? Field::kShape
               : k == "data_offsets" ? Field::kOffsets
                                     : Field::kUnknown;
      const auto bit = static_cast<uint8_t>(field_);
      if (field_ != Field::kUnknown && (seen_fields_ & bit)) return fail_tensor("duplicate field \"" + k + "\"");
      seen_fields_ |= bit;
      state_ = State::kEntryValue;
      return true;
    }
    case State::kSkip:
      return true;
    default:
      return internal();
  }
}

bool HeaderSax::scalar(const Scalar& s) {
  switch (state_) {
    case State::kStart:
      return fail("header is not a JSON object (it is " + s.describe() + ")");
    case State::kTopValue:
      if (!is_metadata_) return fail_tensor("entry must be a JSON object, got " + s.describe());
      if (s.kind != Scalar::kNull) return fail("\"__metadata__\" must be an object of strings, got " + s.describe());
      state_ = State::kTopKey;
      return true;
    case State::kMetaValue:
      if (s.kind != Scalar::kString)
        return fail("\"__metadata__\" key '" + meta_key_ + "' must have a string value, got " + s.describe());
      out_.metadata.emplace(std::move(meta_key_), std::move(*s.string_value));
      state_ = State::kMetaKey;
      return true;
    case State::kEntryValue:
      if (field_ == Field::kUnknown) {
        state_ = State::kEntryKey;
        return true;
      }
      if (field_ == Field::kDType && s.kind == Scalar::kString) {
        dtype_name_ = std::move(*s.string_value);
        state_ = State::kEntryKey;
        return true;
      }
      return fail_tensor(std::string("\"") + field_name() + "\" must be " +
                         (field_ == Field::kDType ? "a string" : "an array of integers") + ", got " + s.describe());
    case State::kShape:
      if (s.kind != Scalar::kUnsigned || s.unsigned_value > uint64_t(std::numeric_limits<int64_t>::max()))
        return fail_tensor("shape[" + std::to_string(entry_.shape.size()) +
                           "] must be an integer in [0, 2^63), got " + s.describe());
      entry_.shape.push_back(static_cast<int64_t>(s.unsigned_value));
      return true;
    case State::kOffsets:
      if (s.kind != Scalar::kUnsigned)
        return fail_tensor("data_offsets[" + std::to_string(n_offsets_) + "] must be a non-negative integer, got " +
                           s.describe());
      if (n_offsets_ == 0) entry_.begin = s.unsigned_value;
      if (n_offsets_ == 1) entry_.end = s.unsigned_value;
      ++n_offsets_;
      return true;
    case State::kSkip:
      return true;
    default:
      return internal();
  }
}

bool HeaderSax::start_container(bool is_object) {
  if (++depth_ > kMaxSafetensorsJsonDepth)
    return fail("header JSON nests deeper than " + std::to_string(kMaxSafetensorsJsonDepth) + " levels");
  const std::string got = is_object ? "an object" : "an array";
  switch (state_) {
    case State::kStart:
      if (!is_object) return fail("header is not a JSON object (it is an array)");
      state_ = State::kTopKey;
      return true;
    case State::kTopValue:
      if (is_metadata_) {
        if (!is_object) return fail("\"__metadata__\" must be an object of strings, got an array");
        state_ = State::kMetaKey;
        return true;
      }
      if (!is_object) return fail_tensor("entry must be a JSON object, got an array");
      entry_ = TensorEntry{};
      entry_.name = name_;
      seen_fields_ = 0;
      n_offsets_ = 0;
      dtype_name_.clear();
      state_ = State::kEntryKey;
      return true;
    case State::kMetaValue:
      return fail("\"__metadata__\" key '" + meta_key_ + "' must have a string value, got " + got);
    case State::kEntryValue:
      if (field_ == Field::kUnknown) {
        skip_depth_ = 1;
        state_ = State::kSkip;
        return true;
      }
      if (field_ == Field::kDType) return fail_tensor("\"dtype\" must be a string, got " + got);
      if (is_object) return fail_tensor(std::string("\"") + field_name() + "\" must be an array of integers, got an object");
      state_ = field_ == Field::kShape ? State::kShape : State::kOffsets;
      return true;
    case State::kShape:
      return fail_tensor("shape[" + std::to_string(entry_.shape.size()) + "] must be an integer, got " + got);
    case State::kOffsets:
      return fail_tensor("data_offsets[" + std::to_string(n_offsets_) + "] must be an integer, got " + got);
    case State::kSkip:
      ++skip_depth_;
      return true;
    default:
      return internal();
  }
}

bool HeaderSax::end_container() {
  --depth_;
  switch (state_) {
    case State::kTopKey:
      state_ = State::kEnd;
      return true;
    case State::kMetaKey:
      state_ = State::kTopKey;
      return true;
    case State::kEntryKey:
      state_ = State::kTopKey;
      return finish_entry();
    case State::kShape:
    case State::kOffsets:
      state_ = State::kEntryKey;
      return true;
    case State::kSkip:
      if (--skip_depth_ == 0) state_ = State::kEntryKey;
      return true;
    default:
      return internal();
  }
}

bool HeaderSax::finish_entry() {
  for (Field f : {Field::kDType, Field::kShape, Field::kOffsets}) {
    if (!(seen_fields_ & static_cast<uint8_t>(f))) {
      field_ = f;
      return fail_tensor(std::string("missing \"") + field_name() + "\"");
    }
  }
  const auto dtype = parse_dtype(dtype_name_);
  if (!dtype) return fail_tensor("unknown dtype '" + dtype_name_ + "'");
  entry_.dtype = *dtype;
  if (n_offsets_ != 2)
    return fail_tensor("\"data_offsets\" must have exactly 2 entries, got " + std::to_string(n_offsets_));
  int64_t numel = 1;
  for (int64_t d : entry_.shape)
    if (__builtin_mul_overflow(numel, d, &numel))
      return fail_tensor("shape " + shape_text(entry_.shape) + " has too many elements (overflows 64 bits)");
  uint64_t nbytes = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(numel), dtype_size(entry_.dtype), &nbytes))
    return fail_tensor("shape " + shape_text(entry_.shape) + " of " + std::string(dtype_name(entry_.dtype)) +
                       " overflows 64 bits in bytes");
  if (entry_.begin > entry_.end)
    return fail_tensor("data_offsets " + offsets_text(entry_.begin, entry_.end) + " end before they begin");
  if (entry_.end - entry_.begin != nbytes)
    return fail_tensor(std::string(dtype_name(entry_.dtype)) + " " + shape_text(entry_.shape) + " needs " +
                       std::to_string(nbytes) + " bytes but data_offsets " + offsets_text(entry_.begin, entry_.end) +
                       " span " + std::to_string(entry_.end - entry_.begin));
  out_.tensors.push_back(std::move(entry_));
  return true;
}

// The official crate requires the tensors, sorted by offsets, to tile the data section exactly:
// no overlap, no gap, nothing after the last tensor. Zero-byte tensors may share an offset.
Status check_layout(const std::string& label, SafetensorsHeader& h) {
  std::unordered_set<std::string_view> names;
  names.reserve(h.tensors.size());
  for (const TensorEntry& t : h.tensors)
    if (!names.insert(t.name).second) return make_error(label + ": tensor '" + t.name + "' appears twice in the header");

  auto by_offsets = [](const TensorEntry& a, const TensorEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  };
  if (!std::is_sorted(h.tensors.begin(), h.tensors.end(), by_offsets))  // writers emit offset order
    std::stable_sort(h.tensors.begin(), h.tensors.end(), by_offsets);
  uint64_t pos = 0;
  const TensorEntry* prev = nullptr;
  for (const TensorEntry& t : h.tensors) {
    auto what = [&] { return label + ": tensor '" + t.name + "': data_offsets " + offsets_text(t.begin, t.end); };
    if (t.end > h.data_size)
      return make_error(what() + " run past the end of the data section (" + std::to_string(h.data_size) +
                        " bytes; is the file truncated?)");
    if (t.begin < pos)
      return make_error(what() + " overlap tensor '" + prev->name + "' " + offsets_text(prev->begin, prev->end));
    if (t.begin > pos)
      return make_error(what() + " leave a gap of " + std::to_string(t.begin - pos) + " bytes " +
                        (prev ? "after tensor '" + prev->name + "' (which ends at " + std::to_string(pos) + ")"
                              : std::string("at the start of the data section")));
    pos = t.end;
    prev = &t;
  }
  if (pos != h.data_size)
    return make_error(label + ": the data section has " + std::to_string(h.data_size - pos) +
                      " bytes after the last tensor" + (prev ? " ('" + prev->name + "')" : std::string()) +
                      " that no tensor covers (" + std::to_string(h.data_size) + " bytes in all)");
  return Status::Ok();
}

}  // namespace

Result<SafetensorsHeader> parse_safetensors(std::span<const uint8_t> file, const std::string& label) {
  if (file.size() < 8)
    return make_error(label + ": file is " + std::to_string(file.size()) +
                      " bytes, too short for the 8-byte header length");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | file[static_cast<size_t>(i)];  // little-endian
  if (header_len > kMaxSafetensorsHeaderBytes)
    return make_error(label + ": header length " + std::to_string(header_len) + " exceeds the limit of " +
                      std::to_string(kMaxSafetensorsHeaderBytes) + " bytes");
  if (header_len > file.size() - 8)
    return make_error(label + ": header length " + std::to_string(header_len) + " runs past the end of the file (" +
                      std::to_string(file.size()) + " bytes)");

  SafetensorsHeader header;
  header.data_offset = 8 + header_len;
  header.data_size = file.size() - header.data_offset;
  const char* text = reinterpret_cast<const char*>(file.data() + 8);
  // nlohmann's lexer takes a NUL byte for the end of input; JSON never allows a raw NUL.
  if (const void* nul = std::memchr(text, 0, header_len))
    return make_error(label + ": invalid JSON in header: NUL byte at header offset " +
                      std::to_string(static_cast<const char*>(nul) - text));
  HeaderSax sax(label, header);
  if (!json::sax_parse(text, text + header_len, &sax)) {
    if (!sax.error().empty()) return make_error(sax.error());
    return make_error(label + ": invalid JSON in header");
  }
  CEDAR_RETURN_IF_ERROR(check_layout(label, header));
  return header;
}

}  // namespace cedar::io
