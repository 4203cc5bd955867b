// Tokenizing a long text on all cores: the text is cut at places no piece crosses
// (Pretokenizer::safe_cut), the parts are encoded by one encoder per thread, and the ids joined
// in text order, so the result is the same as one encode of the whole, on any thread count.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "data/bpe_encoder.h"
#include "data/tokenizer.h"

namespace ptrain {

class ParallelEncoder {
 public:
  ParallelEncoder(const Tokenizer& tokenizer, int threads);

  int threads() const { return threads_; }
  // Appends the ids of `text` (valid UTF-8 for BPE) to `out`.
  void encode(std::string_view text, std::vector<uint32_t>& out);
  // How much of `text` may be encoded before the rest of its document is read: up to its last
  // place that no piece crosses (BPE), all of it (bytes). 0 when there is no such place.
  size_t settled_prefix(std::string_view text) const;

 private:
  const Tokenizer& tokenizer_;
  int threads_;
  std::vector<BpeEncoder> encoders_;  // one per thread, each keeping its cache across calls
  // The ids of each part, kept across calls (no page faults growing them again), each on cache
  // lines of its own: vectors side by side, grown from two threads, would pass their shared
  // line back and forth on every id (false sharing).
  struct alignas(64) Part {
    std::vector<uint32_t> ids;
  };
  std::vector<Part> parts_;
};

}  // namespace ptrain
