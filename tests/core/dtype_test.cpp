#include "core/dtype.h"

#include <gtest/gtest.h>

namespace cedar {
namespace {

TEST(DType, NamesRoundTripAndSizes) {
  for (auto name : {"BOOL", "U8", "I8", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "I64", "U64", "F64",
                    "F8_E4M3", "F8_E5M2", "F8_E8M0"}) {
    auto t = parse_dtype(name);
    ASSERT_TRUE(t.has_value()) << name;
    EXPECT_EQ(dtype_name(*t), name);
  }
  EXPECT_EQ(dtype_size(DType::BF16), 2u);
  EXPECT_EQ(dtype_size(DType::F32), 4u);
  EXPECT_EQ(dtype_size(DType::F8_E8M0), 1u);
  EXPECT_EQ(dtype_size(DType::I64), 8u);
  EXPECT_FALSE(parse_dtype("F4").has_value());
  EXPECT_FALSE(parse_dtype("bf16").has_value());  // safetensors names are case-sensitive
}

}  // namespace
}  // namespace cedar
