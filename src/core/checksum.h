// Well-defined checksums and digests for on-disk formats (the SSD tier of the prefix cache, model
// fingerprints). Both are standard algorithms checked against their published test vectors.
//
//   CRC-32C (Castagnoli; iSCSI, RFC 3720 §12.1 / B.4): reflected polynomial 0x82F63B78, initial value
//     and final xor 0xFFFFFFFF; check value crc32c("123456789") = 0xE3069283. Uses the SSE4.2 crc32
//     instruction when the CPU has it (about 10 GB/s per core), else a portable slicing-by-8 table.
//   SHA-256 (FIPS 180-4).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace cedar {

// CRC-32C of `bytes` continuing from the CRC of earlier bytes (`crc` = the finished CRC-32C of
// everything before, 0 for none): crc32c(a ‖ b) == crc32c_extend(crc32c(a), b).
uint32_t crc32c_extend(uint32_t crc, std::span<const uint8_t> bytes);
inline uint32_t crc32c(std::span<const uint8_t> bytes) { return crc32c_extend(0, bytes); }
// The table implementation alone (tests compare it with the dispatching one).
uint32_t crc32c_extend_portable(uint32_t crc, std::span<const uint8_t> bytes);
// Whether crc32c_extend uses the CPU instruction on this machine.
bool crc32c_hardware();

class Sha256 {
 public:
  Sha256();
  void update(std::span<const uint8_t> bytes);
  void update(std::string_view text) {
    update(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
  }
  // The digest; the object must not be updated afterwards.
  std::array<uint8_t, 32> finish();

 private:
  void compress(const uint8_t* block);
  std::array<uint32_t, 8> h_;
  std::array<uint8_t, 64> buffer_{};
  size_t buffered_ = 0;
  uint64_t total_bytes_ = 0;
};

// Lowercase hex of bytes.
std::string to_hex(std::span<const uint8_t> bytes);

}  // namespace cedar
