// SHA-256 (FIPS 180-4), for the per-file checksums of checkpoints: a truncated or bit-flipped
// file is caught before any of it is loaded.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace ptrain {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t bytes);
  std::string hex_digest();  // finishes the hash; call once

 private:
  void compress(const uint8_t* block);
  std::array<uint32_t, 8> state_;
  std::array<uint8_t, 64> buffer_{};
  size_t buffered_ = 0;
  uint64_t total_bytes_ = 0;
};

// The hex SHA-256 of `bytes` bytes at `data`.
std::string sha256_hex(const void* data, size_t bytes);
// Whether `text` is a digest as sha256_hex writes it: 64 lowercase hexadecimal digits.
bool is_sha256_hex(const std::string& text);

}  // namespace ptrain
