// llm.c token shards, uint16 and uint32: the header checks, then every token read back through
// the stream the samplers use (positional reads, the vocabulary check as tokens are read).
#include <algorithm>
#include <vector>

#include "data/dataset.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const ptrain::fuzz::MemoryFile file(data, size);
  ptrain::fuzz::accepted([&] {
    const ptrain::TokenStream stream({file.path()}, "data.train", 300);
    std::vector<int32_t> window(64);
    for (int64_t pos = 0; pos < stream.size(); pos += 64) {
      const int64_t n = std::min<int64_t>(64, stream.size() - pos);
      stream.copy(pos, n, window.data());
      for (int64_t i = 0; i < n; ++i)
        if (window[i] < 0 || window[i] >= 300) throw std::logic_error("a token outside the vocabulary got through");
    }
  });
  return 0;
}
