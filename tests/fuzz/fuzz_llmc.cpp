// llm.c model files: the header's fields, the size they imply, the parameters.
#include "checkpoint/llmc.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const ptrain::fuzz::MemoryFile file(data, size);
  ptrain::fuzz::accepted([&] {
    const ptrain::LlmcModel m = ptrain::read_llmc(file.path(), "fuzz");
    ptrain::ModelConfig config;
    config.n_layer = m.n_layer, config.n_head = m.n_head, config.n_embd = m.n_embd;
    config.seq_len = m.max_seq_len, config.vocab_size = m.vocab_size;
    ptrain::llmc_mismatches(m, config);
  });
  return 0;
}
