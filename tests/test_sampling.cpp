// Generation (train/sampling): the KV cache draws exactly the tokens that rerunning the whole
// window draws, for a seed, inside the model's context and past it (where the window slides).
#include <catch2/catch.hpp>

#include <algorithm>

#include "backend/backend.h"
#include "model/transformer.h"
#include "test_util.h"
#include "train/sampling.h"

using namespace ptrain;
using namespace ptrain::test;

namespace {

std::vector<int32_t> generated(Transformer& model, std::vector<int32_t> prompt, GenerateOptions options, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> emitted;
  generate(model, prompt, options, rng, [&](int32_t t) { emitted.push_back(t); });
  return emitted;
}

}  // namespace

TEST_CASE("generation draws the same tokens with and without the KV cache", "[sample]") {
  auto backend = make_cpu_backend(0);
  const ModelShape shape{2, 2, 16, 16, 40, 64};  // L, NH, C, max T, V, Vp
  Transformer model(shape, *backend, DType::f32, 1, 16);
  model.init(6, 0.3);  // far from uniform logits, as a trained model's are
  struct Case {
    const char* name;
    double temperature;
    int top_k;
  };
  for (const Case c : {Case{"temperature 1", 1.0, 0}, Case{"top-k 5", 0.8, 5}, Case{"greedy", 0.0, 0}})
    for (const std::vector<int32_t>& prompt : {std::vector<int32_t>{7}, std::vector<int32_t>{1, 2, 3, 4, 5}})
      for (const int tokens : {10, 40}) {  // 40: past the context of 16, the window slides
        INFO(c.name << ", prompt of " << prompt.size() << ", " << tokens << " tokens");
        GenerateOptions options{tokens, c.temperature, c.top_k, -1, 0, true};
        const std::vector<int32_t> cached = generated(model, prompt, options, 11);
        options.kv_cache = false;
        const std::vector<int32_t> rerun = generated(model, prompt, options, 11);
        CHECK(cached.size() == static_cast<size_t>(tokens));
        CHECK(cached == rerun);
      }
}

TEST_CASE("generation stops at the stop token, which it does not emit", "[sample]") {
  auto backend = make_cpu_backend(0);
  const ModelShape shape{1, 2, 8, 16, 6, 16};
  Transformer model(shape, *backend, DType::f32, 1, 16);
  model.init(2, 0.3);
  const std::vector<int32_t> all = generated(model, {0}, GenerateOptions{40, 1.0, 0, -1, 0, true}, 3);
  const int32_t stop = all.at(4);
  const auto first = std::find(all.begin(), all.end(), stop);
  const std::vector<int32_t> until = generated(model, {0}, GenerateOptions{40, 1.0, 0, stop, 0, true}, 3);
  CHECK(until == std::vector<int32_t>(all.begin(), first));
}
