// Test-only tool: runs cedar's numeric conversions / QDQ recipes on raw float32 input so that
// tests/python/test_numeric_formats.py can compare them with independent references (ml_dtypes, numpy).
//
//   cedar_numeric_dump tables OUT
//       OUT.bf16.f32 (65536), OUT.e4m3.f32 (256), OUT.e2m1.f32 (16), OUT.ue8m0.f32 (256): every code decoded.
//   cedar_numeric_dump bf16|e4m3|e2m1|ue8m0_ceil IN.f32 OUT
//       OUT.codes: one code per input value (uint16 little-endian for bf16, one byte otherwise).
//   cedar_numeric_dump fp8_block32_ue8m0|fp4_block16_e4m3|fp4_block32_ue8m0 IN.f32 OUT
//       OUT.values.f32 (QDQ result), OUT.codes.u8 (as stored: e4m3 bytes or packed e2m1),
//       OUT.scales.u8 (one per block), OUT.dequant.f32 (codes + scales dequantized again).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iterator>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/numeric.h"

namespace {

using cedar::Status;

bool read_f32(const std::string& path, std::vector<float>& out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bytes.size() % sizeof(float) != 0) return false;
  out.resize(bytes.size() / sizeof(float));
  std::copy(bytes.begin(), bytes.end(), reinterpret_cast<char*>(out.data()));
  return true;
}

template <typename T>
bool write(const std::string& path, const std::vector<T>& data) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size() * sizeof(T)));
  return static_cast<bool>(out);
}

template <typename T, typename F>
std::vector<T> map(const std::vector<float>& x, F f) {
  std::vector<T> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = f(x[i]);
  return out;
}

int fail(const std::string& message) {
  std::fprintf(stderr, "cedar_numeric_dump: %s\n", message.c_str());
  return 1;
}

int dump_tables(const std::string& prefix) {
  std::vector<float> bf16(65536), e4m3(256), e2m1(16), ue8m0(256);
  for (uint32_t c = 0; c < 65536; ++c) bf16[c] = cedar::bf16_to_f32(static_cast<uint16_t>(c));
  for (uint32_t c = 0; c < 256; ++c) e4m3[c] = cedar::e4m3_to_f32(static_cast<uint8_t>(c));
  for (uint32_t c = 0; c < 16; ++c) e2m1[c] = cedar::e2m1_to_f32(static_cast<uint8_t>(c));
  for (uint32_t c = 0; c < 256; ++c) ue8m0[c] = cedar::ue8m0_to_f32(static_cast<uint8_t>(c));
  if (!write(prefix + ".bf16.f32", bf16) || !write(prefix + ".e4m3.f32", e4m3) || !write(prefix + ".e2m1.f32", e2m1) ||
      !write(prefix + ".ue8m0.f32", ue8m0))
    return fail("cannot write tables under " + prefix);
  return 0;
}

struct Recipe {
  const char* name;
  size_t block;
  bool packed4;
  std::function<Status(std::span<float>, std::span<uint8_t>, std::span<uint8_t>)> qdq;
  std::function<Status(std::span<const uint8_t>, std::span<const uint8_t>, std::span<float>)> dequant;
};

int dump_recipe(const Recipe& r, std::vector<float> x, const std::string& prefix) {
  std::vector<uint8_t> codes(r.packed4 ? x.size() / 2 : x.size()), scales(x.size() / r.block);
  if (Status s = r.qdq(x, codes, scales); !s.ok()) return fail(s.error().message);
  std::vector<float> dequant(x.size());
  if (Status s = r.dequant(codes, scales, dequant); !s.ok()) return fail(s.error().message);
  if (!write(prefix + ".values.f32", x) || !write(prefix + ".codes.u8", codes) ||
      !write(prefix + ".scales.u8", scales) || !write(prefix + ".dequant.f32", dequant))
    return fail("cannot write outputs under " + prefix);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string usage =
      "usage: cedar_numeric_dump tables OUT | cedar_numeric_dump OP IN.f32 OUT\n"
      "  OP: bf16 e4m3 e2m1 ue8m0_ceil fp8_block32_ue8m0 fp4_block16_e4m3 fp4_block32_ue8m0";
  if (argc == 3 && std::string(argv[1]) == "tables") return dump_tables(argv[2]);
  if (argc != 4) return fail(usage);
  const std::string op = argv[1], prefix = argv[3];
  std::vector<float> x;
  if (!read_f32(argv[2], x)) return fail(std::string("cannot read float32 values from ") + argv[2]);

  if (op == "bf16") return write(prefix + ".codes", map<uint16_t>(x, cedar::f32_to_bf16)) ? 0 : fail("write failed");
  if (op == "e4m3") return write(prefix + ".codes", map<uint8_t>(x, cedar::f32_to_e4m3)) ? 0 : fail("write failed");
  if (op == "e2m1") return write(prefix + ".codes", map<uint8_t>(x, cedar::f32_to_e2m1)) ? 0 : fail("write failed");
  if (op == "ue8m0_ceil")
    return write(prefix + ".codes", map<uint8_t>(x, cedar::ue8m0_ceil_pow2)) ? 0 : fail("write failed");

  const Recipe recipes[] = {
      {"fp8_block32_ue8m0", 32, false, cedar::qdq_fp8_block32_ue8m0, cedar::dequant_fp8_block32_ue8m0},
      {"fp4_block16_e4m3", 16, true, cedar::qdq_fp4_block16_e4m3, cedar::dequant_fp4_block16_e4m3},
      {"fp4_block32_ue8m0", 32, true, cedar::qdq_fp4_block32_ue8m0, cedar::dequant_fp4_block32_ue8m0},
  };
  for (const Recipe& r : recipes)
    if (op == r.name) return dump_recipe(r, std::move(x), prefix);
  return fail("unknown op '" + op + "'\n" + usage);
}
