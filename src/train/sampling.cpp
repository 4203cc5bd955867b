#include "train/sampling.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/utf8.h"

namespace ptrain {

namespace {

int32_t draw(std::vector<float> logits, double temperature, int top_k, Rng& rng) {
  const int V = static_cast<int>(logits.size());
  if (temperature <= 0) return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  // The candidates: every id in id order, or the k most likely, ties broken by id, so the draw
  // is a pure function of the seed. Sorting all V ids (50,257 for GPT-2) cost more than the
  // KV-cached forward pass of a small model.
  std::vector<int> order(V);
  for (int i = 0; i < V; ++i) order[i] = i;
  const int k = top_k > 0 ? std::min(top_k, V) : V;
  if (k < V) {
    const auto more_likely = [&](int a, int b) { return logits[a] != logits[b] ? logits[a] > logits[b] : a < b; };
    std::nth_element(order.begin(), order.begin() + (k - 1), order.end(), more_likely);
    std::sort(order.begin(), order.begin() + k, more_likely);
  }
  const float top = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p(k);
  double sum = 0;
  for (int i = 0; i < k; ++i) sum += p[i] = std::exp((logits[order[i]] - top) / temperature);
  double u = rng.uniform_double() * sum;
  for (int i = 0; i < k; ++i)
    if ((u -= p[i]) < 0) return order[i];
  return order[k - 1];
}

}  // namespace

std::vector<int32_t> empty_prompt(const Tokenizer* tokenizer) {
  if (!tokenizer) return {0};
  if (tokenizer->has_end_of_text()) return {static_cast<int32_t>(tokenizer->end_of_text())};
  return {'\n'};
}

void generate(Transformer& model, std::vector<int32_t>& tokens, const GenerateOptions& o, Rng& rng,
              const std::function<void(int32_t)>& emit) {
  PTRAIN_CHECK(!tokens.empty(), "generation needs a first token");
  const size_t T = static_cast<size_t>(model.seq_len());
  // The last T tokens through the whole forward pass (the cache starts from them).
  const auto run_window = [&] {
    const size_t start = tokens.size() > T ? tokens.size() - T : 0;
    return model.start_decoding(tokens.data() + start, static_cast<int>(tokens.size() - start));
  };
  std::vector<float> logits = run_window();
  for (int i = 0; i < o.tokens; ++i) {
    if (o.vocab > 0 && o.vocab < static_cast<int>(logits.size())) logits.resize(static_cast<size_t>(o.vocab));
    const int32_t next = draw(std::move(logits), o.temperature, o.top_k, rng);
    if (next == o.stop_token) break;
    tokens.push_back(next);
    emit(next);
    if (i + 1 == o.tokens) break;
    const bool cached = o.kv_cache && static_cast<size_t>(model.decoded_length()) < T;
    logits = cached ? model.decode_next(next) : run_window();
  }
}

TrainingSamples::TrainingSamples(const ModelShape& shape, std::optional<Tokenizer> tokenizer,
                                 std::string prompt, std::vector<int32_t> prompt_tokens, uint64_t seed, int tokens,
                                 double temperature)
    : shape_(shape),
      tokenizer_(std::move(tokenizer)),
      prompt_(std::move(prompt)),
      prompt_tokens_(std::move(prompt_tokens)),
      seed_(seed),
      tokens_(tokens),
      temperature_(temperature) {}

TrainingSamples::~TrainingSamples() = default;

std::string TrainingSamples::at_step(int64_t step, const std::vector<float>& master) {
  if (!model_) {
    backend_ = make_cpu_backend(0);  // 0: the threads training set, unchanged
    model_ = std::make_unique<Transformer>(shape_, *backend_, DType::f32, 1, shape_.max_seq_len);
  }
  PTRAIN_CHECK(static_cast<int64_t>(master.size()) == model_->num_params(), "a sample needs the whole master weights");
  backend_->upload(model_->master_flat(), master.data());
  model_->weights_loaded();
  const Tokenizer* text = tokenizer_ ? &*tokenizer_ : nullptr;
  std::vector<int32_t> tokens = prompt_tokens_;
  if (tokens.empty()) tokens = empty_prompt(text);
  const size_t prompt_tokens = tokens.size();
  Rng rng(seed_, 0x53414D504C45ull + static_cast<uint64_t>(step));
  GenerateOptions g{tokens_, temperature_, 0, -1, text ? text->vocab_size() : 0};
  if (text && text->has_end_of_text()) g.stop_token = text->end_of_text();
  generate(*model_, tokens, g, rng, [](int32_t) {});
  const std::vector<int32_t> generated(tokens.begin() + static_cast<std::ptrdiff_t>(prompt_tokens), tokens.end());
  std::string shown;
  if (text) {
    shown = replace_invalid_utf8(prompt_ + text->decode(generated));
  } else {
    for (const int32_t id : generated) shown += (shown.empty() ? "" : " ") + std::to_string(id);
  }
  return shown;
}

}  // namespace ptrain
