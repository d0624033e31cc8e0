#include "io/npy.h"

#include <algorithm>
#include <bit>
#include <cctype>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>

#include "io/atomic_file.h"

namespace cedar::io {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;

const char* descr_of(NpyDType t) {
  switch (t) {
    case NpyDType::F32: return "<f4";
    case NpyDType::I32: return "<i4";
    case NpyDType::I64: return "<i8";
  }
  return "?";
}

size_t element_size(NpyDType t) { return t == NpyDType::I64 ? 8 : 4; }

template <typename T>
Status write_typed(const std::filesystem::path& path, NpyDType dtype, std::span<const T> values,
                   std::span<const int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return make_error(path.string() + ": negative dimension " + std::to_string(d));
    n *= d;
  }
  if (n != static_cast<int64_t>(values.size()))
    return make_error(path.string() + ": " + std::to_string(values.size()) + " values for a shape of " +
                      std::to_string(n) + " elements");
  static_assert(std::endian::native == std::endian::little, "npy payloads are written as little-endian memory");
  const std::string header = npy_header(dtype, shape);
  std::vector<uint8_t> bytes;
  bytes.reserve(10 + header.size() + values.size_bytes());
  bytes.insert(bytes.end(), kMagic, kMagic + kMagicLen);
  bytes.push_back(1);
  bytes.push_back(0);
  bytes.push_back(static_cast<uint8_t>(header.size() & 0xFF));
  bytes.push_back(static_cast<uint8_t>(header.size() >> 8));
  bytes.insert(bytes.end(), header.begin(), header.end());
  const auto* raw = reinterpret_cast<const uint8_t*>(values.data());
  bytes.insert(bytes.end(), raw, raw + values.size_bytes());
  return write_file_atomically(path, bytes);
}

// Value text of `'key':` in a header dict (up to the next top-level ',' or '}'), or empty.
std::string dict_value(const std::string& header, const std::string& key) {
  size_t at = header.find("'" + key + "'");
  if (at == std::string::npos) return {};
  at = header.find(':', at);
  if (at == std::string::npos) return {};
  ++at;
  while (at < header.size() && header[at] == ' ') ++at;
  int depth = 0;
  size_t end = at;
  for (; end < header.size(); ++end) {
    const char ch = header[end];
    if (ch == '(') ++depth;
    if (ch == ')') --depth;
    if (depth == 0 && (ch == ',' || ch == '}')) break;
  }
  std::string v = header.substr(at, end - at);
  while (!v.empty() && v.back() == ' ') v.pop_back();
  return v;
}

Result<std::vector<int64_t>> parse_shape(const std::string& text, const std::string& label) {
  auto bad = [&] { return make_error(label + ": malformed shape '" + text + "'"); };
  if (text.size() < 2 || text.front() != '(' || text.back() != ')') return bad();
  std::vector<int64_t> shape;
  size_t i = 1;
  while (i < text.size() - 1) {
    while (i < text.size() - 1 && (text[i] == ' ' || text[i] == ',')) ++i;
    if (i >= text.size() - 1) break;
    if (!std::isdigit(static_cast<unsigned char>(text[i]))) return bad();
    int64_t v = 0;
    while (std::isdigit(static_cast<unsigned char>(text[i]))) {
      if (v > (std::numeric_limits<int64_t>::max() - 9) / 10) return bad();
      v = v * 10 + (text[i++] - '0');
    }
    shape.push_back(v);
  }
  return shape;
}

}  // namespace

int64_t NpyArray::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Result<std::vector<float>> NpyArray::as_f32() const {
  if (dtype != NpyDType::F32) return make_error(std::string("npy array is ") + descr_of(dtype) + ", not <f4");
  std::vector<float> out(data.size() / 4);
  std::memcpy(out.data(), data.data(), out.size() * 4);
  return out;
}

Result<std::vector<int64_t>> NpyArray::as_i64() const {
  if (dtype == NpyDType::I64) {
    std::vector<int64_t> out(data.size() / 8);
    std::memcpy(out.data(), data.data(), out.size() * 8);
    return out;
  }
  if (dtype == NpyDType::I32) {
    std::vector<int64_t> out(data.size() / 4);
    for (size_t i = 0; i < out.size(); ++i) {
      int32_t v;
      std::memcpy(&v, data.data() + 4 * i, 4);
      out[i] = v;
    }
    return out;
  }
  return make_error("npy array is <f4, not an integer array");
}

std::string npy_header(NpyDType dtype, std::span<const int64_t> shape) {
  std::string s = std::string("{'descr': '") + descr_of(dtype) + "', 'fortran_order': False, 'shape': (";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  if (shape.size() == 1) s += ",";
  s += "), }";
  // NumPy leaves room for the first axis to grow to 21 digits (GROWTH_AXIS_MAX_DIGITS); doing the same
  // makes the files byte-identical to numpy.save.
  if (!shape.empty()) s.append(21 - std::min<size_t>(21, std::to_string(shape[0]).size()), ' ');
  const size_t total = 10 + s.size() + 1;  // preamble + dict + '\n'
  s.append((64 - total % 64) % 64, ' ');
  s.push_back('\n');
  return s;
}

Status write_npy(const std::filesystem::path& path, std::span<const float> values, std::span<const int64_t> shape) {
  return write_typed(path, NpyDType::F32, values, shape);
}
Status write_npy(const std::filesystem::path& path, std::span<const int32_t> values, std::span<const int64_t> shape) {
  return write_typed(path, NpyDType::I32, values, shape);
}
Status write_npy(const std::filesystem::path& path, std::span<const int64_t> values, std::span<const int64_t> shape) {
  return write_typed(path, NpyDType::I64, values, shape);
}

Result<NpyArray> parse_npy(std::span<const uint8_t> bytes, const std::string& label) {
  auto bad = [&](const std::string& why) { return make_error(label + ": not a .npy file: " + why); };
  if (bytes.size() < 10 || std::memcmp(bytes.data(), kMagic, kMagicLen) != 0) return bad("no NumPy magic");
  const int major = bytes[6];
  size_t header_len = 0, preamble = 0;
  if (major == 1) {
    header_len = bytes[8] | (size_t{bytes[9]} << 8);
    preamble = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) return bad("truncated preamble");
    header_len = bytes[8] | (size_t{bytes[9]} << 8) | (size_t{bytes[10]} << 16) | (size_t{bytes[11]} << 24);
    preamble = 12;
  } else {
    return bad("format version " + std::to_string(major) + "." + std::to_string(bytes[7]));
  }
  if (bytes.size() - preamble < header_len) return bad("truncated header");
  const std::string header(reinterpret_cast<const char*>(bytes.data() + preamble), header_len);

  NpyArray a;
  const std::string descr = dict_value(header, "descr");
  if (descr == "'<f4'") a.dtype = NpyDType::F32;
  else if (descr == "'<i4'") a.dtype = NpyDType::I32;
  else if (descr == "'<i8'") a.dtype = NpyDType::I64;
  else return bad("dtype " + (descr.empty() ? std::string("missing") : descr) + " (supported: '<f4', '<i4', '<i8')");
  const std::string fortran = dict_value(header, "fortran_order");
  if (fortran != "False") return bad("fortran_order " + (fortran.empty() ? std::string("missing") : fortran));
  CEDAR_ASSIGN_OR_RETURN(a.shape, parse_shape(dict_value(header, "shape"), label));

  uint64_t n = 1;
  for (int64_t d : a.shape) {
    if (d != 0 && n > std::numeric_limits<uint64_t>::max() / 8 / static_cast<uint64_t>(d)) return bad("shape overflows");
    n *= static_cast<uint64_t>(d);
  }
  const uint64_t payload = bytes.size() - preamble - header_len;
  if (payload != n * element_size(a.dtype))
    return bad("payload of " + std::to_string(payload) + " bytes for " + std::to_string(n) + " elements of " +
               descr_of(a.dtype));
  a.data.assign(bytes.begin() + static_cast<std::ptrdiff_t>(preamble + header_len), bytes.end());
  return a;
}

Result<NpyArray> read_npy(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return make_error("cannot open '" + path.string() + "'");
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (f.bad()) return make_error("error reading '" + path.string() + "'");
  return parse_npy(bytes, path.string());
}

}  // namespace cedar::io
