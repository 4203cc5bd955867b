#include "model/gpt_params.h"

namespace ptrain {

std::vector<ParamSpec> gpt_param_specs(const GptShape& s) {
  const int64_t L = s.n_layer, C = s.n_embd;
  return {
      {"wte", {s.padded_vocab, C}, true},
      {"wpe", {s.max_seq_len, C}, true},
      {"ln1w", {L, C}, false},
      {"ln1b", {L, C}, false},
      {"qkvw", {L, 3 * C, C}, true},
      {"qkvb", {L, 3 * C}, false},
      {"attprojw", {L, C, C}, true},
      {"attprojb", {L, C}, false},
      {"ln2w", {L, C}, false},
      {"ln2b", {L, C}, false},
      {"fcw", {L, 4 * C, C}, true},
      {"fcb", {L, 4 * C}, false},
      {"fcprojw", {L, C, 4 * C}, true},
      {"fcprojb", {L, C}, false},
      {"lnfw", {C}, false},
      {"lnfb", {C}, false},
  };
}

static int64_t product(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t gpt_num_params(const GptShape& s) {
  int64_t n = 0;
  for (const auto& spec : gpt_param_specs(s)) n += product(spec.shape);
  return n;
}

}  // namespace ptrain
