// Test-only tool: packs rows of raw float32 values into KV cache records with cedar's codecs
// (kv/kv_format.h) so that tests/python/test_kv_format.py can compare the bytes with a numpy packing.
//
//   cedar_kv_dump RECIPE WIDTH ROPE_DIM IN.f32 OUT
//       RECIPE: fp4_b16_e4m3 | fp4_b32_ue8m0 | fp8_b32_ue8m0 | v4_fp8_bf16
//       OUT.records.u8 (rows × record bytes), OUT.decoded.f32 (records decoded again).
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "kv/kv_format.h"

namespace {

int fail(const std::string& message) {
  std::fprintf(stderr, "cedar_kv_dump: %s\n", message.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace cedar;
  if (argc != 6) return fail("usage: cedar_kv_dump RECIPE WIDTH ROPE_DIM IN.f32 OUT");
  const std::string name = argv[1];
  KvRecipe recipe = KvRecipe::None;
  for (KvRecipe r : {KvRecipe::Fp4Block16E4m3, KvRecipe::Fp4Block32Ue8m0, KvRecipe::Fp8Block32Ue8m0,
                     KvRecipe::V4Fp8Bf16Rope})
    if (kv_recipe_name(r) == name) recipe = r;
  if (recipe == KvRecipe::None) return fail("unknown recipe " + name);
  auto f = KvRecordFormat::make(recipe, KvStorage::Packed, std::stoll(argv[2]), std::stoll(argv[3]));
  if (!f.ok()) return fail(f.error().message);
  std::ifstream in(argv[4], std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t row_bytes = static_cast<size_t>(f->width) * sizeof(float);
  if (!in.eof() && !in.good()) return fail(std::string("cannot read ") + argv[4]);
  if (bytes.empty() || bytes.size() % row_bytes != 0) return fail("input is not a whole number of rows");
  const size_t rows = bytes.size() / row_bytes;
  std::vector<float> values(bytes.size() / sizeof(float)), decoded(values.size());
  std::copy(bytes.begin(), bytes.end(), reinterpret_cast<char*>(values.data()));
  const size_t rb = static_cast<size_t>(f->record_bytes());
  std::vector<uint8_t> records(rows * rb);
  for (size_t r = 0; r < rows; ++r) {
    std::span<float> row(values.data() + r * static_cast<size_t>(f->width), static_cast<size_t>(f->width));
    const Status st = f->encode(row, std::span<uint8_t>(records).subspan(r * rb, rb));
    if (!st.ok()) return fail(st.error().message);
    f->decode(std::span<const uint8_t>(records).subspan(r * rb, rb),
              std::span<float>(decoded).subspan(r * static_cast<size_t>(f->width), static_cast<size_t>(f->width)));
  }
  const std::string out = argv[5];
  std::ofstream rec(out + ".records.u8", std::ios::binary);
  rec.write(reinterpret_cast<const char*>(records.data()), static_cast<std::streamsize>(records.size()));
  std::ofstream dec(out + ".decoded.f32", std::ios::binary);
  dec.write(reinterpret_cast<const char*>(decoded.data()), static_cast<std::streamsize>(decoded.size() * 4));
  return rec && dec ? 0 : fail("cannot write " + out);
}
