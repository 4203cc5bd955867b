// Encoder (token + position embedding) kernels under the SIMT emulator against the CPU backend's
// embedding ops, and the host-side token bucketing that makes the backward deterministic.
#include <algorithm>

#include "kernel_test.h"
#include "encoder.cuh"

namespace ptrain::test {
namespace {

struct EncoderShape {
  int B, Tn, C, V;
  int distinct;  // token ids drawn: fewer than B * Tn, so tokens repeat
};
// Odd channel counts (ragged, unaligned rows), vocabularies far smaller than B * Tn, and a GPT-2
// 124M shape with its real vocabulary.
const std::vector<EncoderShape> kShapes{{1, 1, 1, 1, 1},   {2, 3, 7, 5, 5},   {3, 7, 19, 4, 4},
                                        {2, 5, 111, 9, 4}, {2, 4, 769, 3, 3}, {2, 64, 768, 50257, 40}};

// n tokens drawn from `distinct` ids in [0, V), the last id (the table's last row) among them.
std::vector<int32_t> draw_tokens(int n, int V, int distinct, uint64_t seed) {
  Rng rng(seed, 0x746f6b656e);
  std::vector<int32_t> pool(distinct);
  for (auto& id : pool) id = static_cast<int32_t>(rng.below(V));
  pool.back() = V - 1;
  std::vector<int32_t> tokens(n);
  for (auto& t : tokens) t = pool[rng.below(distinct)];
  return tokens;
}

// A real vocabulary's table (GPT-2: 50257 x 768) is too large to hand the CPU reference whole in
// a quick test. The kernels get the full table; the reference gets the rows that matter,
// renumbered, and the tokens renumbered to match. Rows are independent, so the reference's rows
// are exactly the full op's. The rows that matter: all of a small vocabulary; otherwise the
// tokens' rows, their neighbours (where an off-by-one write lands) and the first and last row.
constexpr int kWholeVocab = 1024;
struct VocabRows {
  std::vector<int> rows;        // ascending rows of the full table
  std::vector<int32_t> tokens;  // the tokens as indices into `rows`
};

VocabRows vocab_rows(const std::vector<int32_t>& tokens, int V) {
  std::vector<bool> keep(V, V <= kWholeVocab);
  keep[0] = true;
  keep[V - 1] = true;
  for (int32_t t : tokens)
    for (int r = t - 1; r <= t + 1; ++r)
      if (r >= 0 && r < V) keep[r] = true;
  VocabRows out;
  std::vector<int32_t> index(V, -1);
  for (int r = 0; r < V; ++r)
    if (keep[r]) {
      index[r] = static_cast<int32_t>(out.rows.size());
      out.rows.push_back(r);
    }
  for (int32_t t : tokens) out.tokens.push_back(index[t]);
  return out;
}

// Writes `values` (rows.size(), C) to the given rows of a full table.
template <typename T>
void scatter_rows(std::vector<T>& table, const std::vector<float>& values, const std::vector<int>& rows, int C) {
  for (size_t r = 0; r < rows.size(); ++r)
    for (int c = 0; c < C; ++c)
      table[static_cast<size_t>(rows[r]) * C + c] = kernels::from_float<T>(values[r * C + c]);
}

// A full (V, C) table holding `values` at `rows` and zeros elsewhere.
template <typename T>
std::vector<T> full_table(const std::vector<float>& values, const std::vector<int>& rows, int V, int C) {
  std::vector<T> table(static_cast<size_t>(V) * C, kernels::from_float<T>(0.0f));
  scatter_rows(table, values, rows, C);
  return table;
}

// The given rows of a full table, as floats (rows.size(), C).
template <typename T>
std::vector<float> gather_rows(const std::vector<T>& table, const std::vector<int>& rows, int C) {
  std::vector<float> out(rows.size() * C);
  for (size_t r = 0; r < rows.size(); ++r)
    for (int c = 0; c < C; ++c) out[r * C + c] = kernels::to_float(table[static_cast<size_t>(rows[r]) * C + c]);
  return out;
}

TEMPLATE_TEST_CASE("encoder_forward kernel matches the CPU backend", "[kernels][encoder]", float, bf16, fp16) {
  constexpr Format f = format_of<TestType>();
  CpuReference cpu;
  for (const EncoderShape s : kShapes) {
    std::vector<int32_t> tokens = draw_tokens(s.B * s.Tn, s.V, s.distinct, 1);
    VocabRows vocab = vocab_rows(tokens, s.V);
    const int R = static_cast<int>(vocab.rows.size());
    const size_t n = static_cast<size_t>(s.B) * s.Tn * s.C;
    std::vector<float> wte = random_on_grid(static_cast<size_t>(R) * s.C, 2, 1.0f, f),
                       wpe = random_on_grid(static_cast<size_t>(s.Tn) * s.C, 3, 0.5f, f), ref(n);
    cpu->embedding_forward(cpu.view(ref, {s.B, s.Tn, s.C}, f), cpu.tokens(vocab.tokens, {s.B, s.Tn}),
                           cpu.view(wte, {R, s.C}), cpu.view(wpe, {s.Tn, s.C}));
    const auto d_wte = full_table<TestType>(wte, vocab.rows, s.V, s.C);
    const auto d_wpe = to_storage<TestType>(wpe);
    for (const auto& order : simt::test_orders()) {
      simt::ScopedOptions use(order);
      INFO("B=" << s.B << " T=" << s.Tn << " C=" << s.C << " V=" << s.V << " order " << order.name());
      auto out = poisoned<TestType>(n);
      kernels::encoder_forward(out.data(), tokens.data(), d_wte.data(), d_wpe.data(), s.B, s.Tn, s.C, nullptr);
      // One rounded addition per element: exactly the CPU's.
      expect_identical("encoder_forward out", to_floats(out), ref);
    }
  }
}

TEMPLATE_TEST_CASE("encoder_backward kernels match the CPU backend bit for bit", "[kernels][encoder]", float, bf16,
                   fp16) {
  constexpr Format f = format_of<TestType>();
  CpuReference cpu;
  for (const EncoderShape s : kShapes) {
    std::vector<int32_t> tokens = draw_tokens(s.B * s.Tn, s.V, s.distinct, 4);
    VocabRows vocab = vocab_rows(tokens, s.V);
    const int R = static_cast<int>(vocab.rows.size());
    const size_t n = static_cast<size_t>(s.B) * s.Tn * s.C;
    std::vector<float> dout = random_on_grid(n, 5, 1.0f, f);
    // Gradients accumulate (+=): start from non-zero values.
    const std::vector<float> dwte0 = random_on_grid(static_cast<size_t>(R) * s.C, 6, 0.5f, f),
                             dwpe0 = random_on_grid(static_cast<size_t>(s.Tn) * s.C, 7, 0.5f, f);
    std::vector<float> ref_dwte = dwte0, ref_dwpe = dwpe0;
    cpu->embedding_backward(cpu.view(ref_dwte, {R, s.C}, f), cpu.view(ref_dwpe, {s.Tn, s.C}, f),
                            cpu.view(dout, {s.B, s.Tn, s.C}), cpu.tokens(vocab.tokens, {s.B, s.Tn}));
    const int n_pos = s.B * s.Tn;
    // Packed as the backend uploads them: unused slots hold garbage the kernel must not read.
    std::vector<int> packed(kernels::packed_bucket_ints(n_pos), -7);
    kernels::pack_buckets(kernels::bucket_tokens(tokens.data(), n_pos), n_pos, packed.data());
    const auto d_dout = to_storage<TestType>(dout);
    auto dwte = full_table<TestType>(dwte0, vocab.rows, s.V, s.C);
    for (const auto& order : simt::test_orders()) {
      simt::ScopedOptions use(order);
      INFO("B=" << s.B << " T=" << s.Tn << " C=" << s.C << " V=" << s.V << " order " << order.name());
      scatter_rows(dwte, dwte0, vocab.rows, s.C);  // the starting values again
      auto dwpe = to_storage<TestType>(dwpe0);
      kernels::encoder_backward(dwte.data(), dwpe.data(), d_dout.data(), packed.data(), s.B, s.Tn, s.C, nullptr);
      // Each element sums its positions in the CPU's order into the old value and rounds once,
      // so even bf16 and fp16 results are the CPU's exactly.
      expect_identical("encoder_backward dwte", gather_rows(dwte, vocab.rows, s.C), ref_dwte);
      expect_identical("encoder_backward dwpe", to_floats(dwpe), ref_dwpe);
    }
  }
}

TEST_CASE("bucket_tokens groups positions by token id in order", "[kernels][encoder]") {
  const std::vector<int> tokens{5, 2, 5, 0, 2, 5, 9};
  const kernels::TokenBuckets b = kernels::bucket_tokens(tokens.data(), static_cast<int>(tokens.size()));
  CHECK(b.ids == std::vector<int>{0, 2, 5, 9});
  CHECK(b.starts == std::vector<int>{0, 1, 3, 6, 7});
  CHECK(b.positions == std::vector<int>{3, 1, 4, 0, 2, 5, 6});
}

TEST_CASE("pack_buckets lays the buckets out by position count only", "[kernels][encoder]") {
  const std::vector<int> tokens{5, 2, 5, 0, 2, 5, 9};
  const int n = static_cast<int>(tokens.size());
  std::vector<int> packed(kernels::packed_bucket_ints(n), -1);
  kernels::pack_buckets(kernels::bucket_tokens(tokens.data(), n), n, packed.data());
  // count | ids (n slots, 4 used) | starts (n + 1 slots, 5 used) | positions (n)
  CHECK(packed == std::vector<int>{4, 0, 2, 5, 9, -1, -1, -1, 0, 1, 3, 6, 7, -1, -1, -1, 3, 1, 4, 0, 2, 5, 6});
  const kernels::PackedBucketsView view = kernels::PackedBucketsView::of(packed.data(), n);
  CHECK(view.count == 4);
  CHECK(view.ids[3] == 9);
  CHECK(view.starts[4] == 7);
  CHECK(view.positions[0] == 3);
}

TEST_CASE("bucket_tokens places every position once in its token's bucket", "[kernels][encoder]") {
  for (const int n : {1, 19, 769, 8192})
    for (const int V : {3, 50257}) {
      INFO("n=" << n << " V=" << V);
      const std::vector<int32_t> tokens = draw_tokens(n, V, V < 64 ? V : 64, static_cast<uint64_t>(n));
      const kernels::TokenBuckets b = kernels::bucket_tokens(tokens.data(), n);
      REQUIRE(b.starts.size() == b.ids.size() + 1);
      REQUIRE(b.positions.size() == static_cast<size_t>(n));
      CHECK(b.starts.front() == 0);
      CHECK(b.starts.back() == n);
      std::vector<int> seen(n, 0);
      size_t bad_ids = 0, bad_buckets = 0, bad_positions = 0;
      for (size_t k = 0; k < b.ids.size(); ++k) {
        if (k > 0 && b.ids[k] <= b.ids[k - 1]) ++bad_ids;  // ids ascending and distinct
        if (b.starts[k + 1] <= b.starts[k]) ++bad_buckets;  // no empty bucket
        for (int j = b.starts[k]; j < b.starts[k + 1]; ++j) {
          const int p = b.positions[j];
          const bool ascending = j == b.starts[k] || p > b.positions[j - 1];
          if (p < 0 || p >= n || tokens[p] != b.ids[k] || !ascending) {
            ++bad_positions;
            continue;
          }
          ++seen[p];
        }
      }
      CHECK(bad_ids == 0);
      CHECK(bad_buckets == 0);
      CHECK(bad_positions == 0);
      CHECK(std::count(seen.begin(), seen.end(), 1) == n);
    }
}

TEST_CASE("bucket_tokens handles no tokens and rejects negative ids", "[kernels][encoder]") {
  const kernels::TokenBuckets empty = kernels::bucket_tokens(nullptr, 0);
  CHECK(empty.ids.empty());
  CHECK(empty.starts == std::vector<int>{0});
  CHECK(empty.positions.empty());
  const std::vector<int> bad{3, -1};
  CHECK_THROWS_AS(kernels::bucket_tokens(bad.data(), 2), std::invalid_argument);
}

}  // namespace
}  // namespace ptrain::test
