// A Hugging Face config.json held against a model section (model.init_from): JSON (its nesting
// bounded), then every key's type and value, for both architectures. A config.json that ptrain
// writes for a model must be accepted for that model.
#include <nlohmann/json.hpp>

#include "checkpoint/hf_layout.h"
#include "core/json_input.h"
#include "fuzz_util.h"

namespace {
ptrain::ModelConfig model(ptrain::Arch arch) {
  ptrain::ModelConfig m;
  m.arch = arch;
  m.n_layer = 2;
  m.n_head = 4;
  m.n_embd = 64;
  m.seq_len = 32;
  m.vocab_size = 100;
  return m;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nlohmann::json config;
  const auto parse = [&] {
    config = ptrain::parse_json(std::string(reinterpret_cast<const char*>(data), size), "config.json");
  };
  if (!ptrain::fuzz::accepted(parse)) return 0;
  for (const ptrain::Arch arch : {ptrain::Arch::gpt2, ptrain::Arch::llama}) {
    const ptrain::ModelConfig m = model(arch);
    ptrain::fuzz::accepted([&] { ptrain::check_hf_config(config, m); });
    const ptrain::HfConfigCheck own = ptrain::check_hf_config(ptrain::hf_config_json(m, -1, "float32"), m);
    if (!own.problems.empty()) throw std::logic_error("ptrain's own config.json is refused: " + own.problems[0]);
  }
  return 0;
}
