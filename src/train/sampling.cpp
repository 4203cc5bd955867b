#include "train/sampling.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace ptrain {

namespace {

int32_t draw(std::vector<float> logits, double temperature, int top_k, Rng& rng) {
  const int V = static_cast<int>(logits.size());
  if (temperature <= 0) return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  std::vector<int> order(V);
  for (int i = 0; i < V; ++i) order[i] = i;
  const int k = top_k > 0 ? std::min(top_k, V) : V;
  // Ties broken by token id, so the draw is a pure function of the seed.
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int a, int b) {
    return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
  });
  std::vector<double> p(k);
  double sum = 0;
  for (int i = 0; i < k; ++i) sum += p[i] = std::exp((logits[order[i]] - logits[order[0]]) / temperature);
  double u = rng.uniform_double() * sum;
  for (int i = 0; i < k; ++i)
    if ((u -= p[i]) < 0) return order[i];
  return order[k - 1];
}

}  // namespace

std::vector<int32_t> empty_prompt(const Tokenizer* tokenizer) {
  if (!tokenizer) return {0};
  if (tokenizer->has_end_of_text()) return {tokenizer->end_of_text()};
  return {'\n'};
}

void generate(Gpt& model, std::vector<int32_t>& tokens, const GenerateOptions& o, Rng& rng,
              const std::function<void(int32_t)>& emit) {
  PTRAIN_CHECK(!tokens.empty(), "generation needs a first token");
  const int T = model.seq_len();
  std::vector<int32_t> window(static_cast<size_t>(T), 0);
  for (int i = 0; i < o.tokens; ++i) {
    // The last T tokens; positions after them are ignored by causal attention.
    const size_t start = tokens.size() > window.size() ? tokens.size() - window.size() : 0;
    std::fill(window.begin(), window.end(), 0);
    std::copy(tokens.begin() + static_cast<std::ptrdiff_t>(start), tokens.end(), window.begin());
    const int position = static_cast<int>(tokens.size() - start) - 1;
    std::vector<float> logits = model.next_token_logits(window.data(), position);
    if (o.vocab > 0 && o.vocab < static_cast<int>(logits.size())) logits.resize(static_cast<size_t>(o.vocab));
    const int32_t next = draw(std::move(logits), o.temperature, o.top_k, rng);
    if (next == o.stop_token) break;
    tokens.push_back(next);
    emit(next);
  }
}

}  // namespace ptrain
