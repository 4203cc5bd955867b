// `--set key=value` flags: each line of the input is one flag, applied to a valid config.
#include <sstream>
#include <string>
#include <vector>

#include "config/config.h"
#include "fuzz_util.h"

namespace {
const char* kBase =
    "model: {n_layer: 2, n_head: 2, n_embd: 32, seq_len: 16, vocab_size: 256}\n"
    "data: {synthetic: {vocab: 256, tokens: 100000}}\n";
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  std::vector<std::string> flags;
  for (std::string line; std::getline(in, line) && flags.size() < 64;) flags.push_back(line);
  ptrain::fuzz::accepted([&] { ptrain::config_to_yaml(ptrain::parse_config(kBase, "base.yaml", flags)); });
  return 0;
}
