// CRC-32C and SHA-256 against their published test vectors: the CRC catalogue's check value
// (crc32c("123456789") = 0xE3069283) and RFC 3720 appendix B.4 for CRC-32C; FIPS 180-2 appendix B
// (one-block "abc", two-block 448-bit message, one million 'a') and the empty-message digest for SHA-256.
#include "core/checksum.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace cedar {
namespace {

std::span<const uint8_t> as_bytes(std::string_view s) { return {reinterpret_cast<const uint8_t*>(s.data()), s.size()}; }

std::string sha256_hex(std::string_view s) {
  Sha256 h;
  h.update(s);
  const auto d = h.finish();
  return to_hex(d);
}

TEST(Crc32c, CheckValue) {
  EXPECT_EQ(crc32c(as_bytes("123456789")), 0xE3069283u);
  EXPECT_EQ(crc32c_extend_portable(0, as_bytes("123456789")), 0xE3069283u);
  EXPECT_EQ(crc32c({}), 0u);
}

TEST(Crc32c, Rfc3720Vectors) {
  std::vector<uint8_t> zeros(32, 0), ones(32, 0xFF), inc(32), dec(32);
  for (int i = 0; i < 32; ++i) {
    inc[i] = static_cast<uint8_t>(i);
    dec[i] = static_cast<uint8_t>(31 - i);
  }
  for (auto* f : {&crc32c_extend, &crc32c_extend_portable}) {
    EXPECT_EQ(f(0, zeros), 0x8A9136AAu);
    EXPECT_EQ(f(0, ones), 0x62A8AB43u);
    EXPECT_EQ(f(0, inc), 0x46DD794Eu);
    EXPECT_EQ(f(0, dec), 0x113FDB5Cu);
  }
  // The iSCSI SCSI Read (10) command PDU of B.4.
  const std::vector<uint8_t> pdu = {0x01, 0xc0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
                                    0x00, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00,
                                    0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x18, 0x28, 0x00, 0x00, 0x00,
                                    0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
  EXPECT_EQ(crc32c(pdu), 0xD9963A56u);
}

TEST(Crc32c, ExtendEqualsOneShotAndHardwareEqualsTableAtEveryLengthAndAlignment) {
  std::mt19937_64 rng(7);
  std::vector<uint8_t> data(4096 + 16);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  std::printf("crc32c uses the %s\n", crc32c_hardware() ? "SSE4.2 instruction" : "portable table");
  for (size_t offset = 0; offset < 9; ++offset) {
    for (size_t len : {0, 1, 7, 8, 9, 63, 64, 65, 1000, 4096}) {
      const std::span<const uint8_t> s(data.data() + offset, len);
      const uint32_t whole = crc32c(s);
      ASSERT_EQ(whole, crc32c_extend_portable(0, s)) << offset << " " << len;
      for (size_t cut : {size_t{0}, len / 3, len}) {
        ASSERT_EQ(crc32c_extend(crc32c(s.first(cut)), s.subspan(cut)), whole) << offset << " " << len << " " << cut;
      }
    }
  }
}

TEST(Crc32c, DetectsEverySingleBitFlip) {
  std::vector<uint8_t> data(256);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 37 + 11);
  const uint32_t good = crc32c(data);
  for (size_t i = 0; i < data.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      data[i] ^= static_cast<uint8_t>(1 << bit);
      ASSERT_NE(crc32c(data), good) << i << " " << bit;
      data[i] ^= static_cast<uint8_t>(1 << bit);
    }
  }
}

TEST(Sha256, Fips180Vectors) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(sha256_hex(std::string(1'000'000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, SplitUpdatesEqualOneUpdate) {
  std::string msg;
  for (int i = 0; i < 300; ++i) msg.push_back(static_cast<char>(i * 13 + 5));
  const std::string whole = sha256_hex(msg);
  for (size_t a = 0; a <= msg.size(); a += 7) {
    for (size_t b = a; b <= msg.size(); b += 29) {
      Sha256 h;
      h.update(std::string_view(msg).substr(0, a));
      h.update(std::string_view(msg).substr(a, b - a));
      h.update(std::string_view(msg).substr(b));
      ASSERT_EQ(to_hex(h.finish()), whole) << a << " " << b;
    }
  }
  // Lengths around the padding boundary (55, 56, 64 bytes) give distinct digests.
  EXPECT_NE(sha256_hex(std::string(55, 'x')), sha256_hex(std::string(56, 'x')));
  EXPECT_NE(sha256_hex(std::string(63, 'x')), sha256_hex(std::string(64, 'x')));
}

}  // namespace
}  // namespace cedar
