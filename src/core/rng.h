// Deterministic random numbers. Everything random in ptrain (initialisation, data sampling,
// synthetic corpora) derives from these, so a run is a pure function of its config and seed.
// The state is one 64-bit counter plus a key, so it is trivially saved in checkpoints.
#pragma once

#include <cmath>
#include <cstdint>

namespace ptrain {

// SplitMix64 finaliser: a high-quality 64-bit mix, used as a counter-based hash.
inline uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

inline uint64_t hash_combine(uint64_t a, uint64_t b) { return mix64(a ^ mix64(b)); }

class Rng {
 public:
  explicit Rng(uint64_t seed = 0, uint64_t stream = 0) : key_(hash_combine(seed, stream)) {}

  uint64_t next_u64() { return mix64(key_ + 0x632BE59BD9B4E019ull * ++counter_); }
  // Uniform in [0, 1) with 24 random bits: exactly representable as a float.
  float uniform() { return static_cast<float>(next_u64() >> 40) * (1.0f / 16777216.0f); }
  double uniform_double() { return static_cast<double>(next_u64() >> 11) * (1.0 / 9007199254740992.0); }
  // Uniform integer in [0, n) (n > 0), without modulo bias worth noticing for n << 2^64.
  uint64_t below(uint64_t n) { return static_cast<uint64_t>((static_cast<unsigned __int128>(next_u64()) * n) >> 64); }
  // Standard normal by Box-Muller (one value per call, so the stream stays simple).
  double normal() {
    double u1 = uniform_double();
    double u2 = uniform_double();
    if (u1 < 1e-300) u1 = 1e-300;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

  uint64_t counter() const { return counter_; }
  uint64_t key() const { return key_; }
  void restore(uint64_t key, uint64_t counter) { key_ = key; counter_ = counter; }

 private:
  uint64_t key_;
  uint64_t counter_ = 0;
};

}  // namespace ptrain
