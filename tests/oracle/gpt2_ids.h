// ptrain's GPT-2 tokenizer (the default vocabulary) as the oracle tests compare it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace ptrain::test {

inline const Tokenizer& gpt2() {
  static const Tokenizer t = Tokenizer::load("gpt2");
  return t;
}

// ptrain's ids for `text`.
inline std::vector<int32_t> gpt2_ids(const std::string& text) {
  const std::vector<uint32_t> ids = gpt2().encode(text, "text");
  return {ids.begin(), ids.end()};
}

}  // namespace ptrain::test
