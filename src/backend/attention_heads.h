// The head layout of attention's qkv rows: n_head query heads, then n_kv_head key heads, then as
// many value heads, each head_size wide. Grouped-query attention (Llama) has n_kv_head < n_head,
// each K/V head serving a group of n_head / n_kv_head consecutive query heads; GPT-2 has them
// equal, and then a row is q, k, v of width C each. The attention ops read n_kv_head from the
// widths of qkv and of the output (n_head * head_size), so their signatures serve both.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace ptrain {

struct AttentionHeads {
  int64_t n_head = 0, n_kv_head = 0, head_size = 0;

  int64_t q_width() const { return n_head * head_size; }    // also attention's output width
  int64_t kv_width() const { return n_kv_head * head_size; }
  int64_t row_width() const { return q_width() + 2 * kv_width(); }
  int64_t group() const { return n_head / n_kv_head; }
  int64_t k_offset(int64_t h) const { return q_width() + (h / group()) * head_size; }  // K of query head h
  int64_t v_offset(int64_t h) const { return k_offset(h) + kv_width(); }

  // From a qkv row's width, the output's width and n_head; valid() is false when they disagree.
  static AttentionHeads of(int64_t qkv_width, int64_t out_width, int64_t n_head) {
    AttentionHeads a;
    if (n_head <= 0 || out_width <= 0 || out_width % n_head != 0) return a;
    a.n_head = n_head;
    a.head_size = out_width / n_head;
    const int64_t kv_heads_twice = qkv_width / a.head_size - n_head;
    if (qkv_width % a.head_size == 0 && kv_heads_twice > 0 && kv_heads_twice % 2 == 0) a.n_kv_head = kv_heads_twice / 2;
    return a;
  }
  bool valid() const { return head_size > 0 && n_kv_head > 0 && n_head % n_kv_head == 0; }
};

// The layout of qkv (..., W) for attention's output or its gradient (..., C) with n_head heads;
// throws, naming `op` and the shapes, when they fit none.
AttentionHeads attention_heads(const char* op, const Tensor& qkv, const Tensor& out, int n_head);

// The layout of qkv (..., W) for QK-norm with q's and k's norm weights (head_size each) and
// rstd (rows n_head + rows n_kv_head); throws, naming `op` and the shapes, when they disagree.
AttentionHeads qk_norm_heads(const char* op, const Tensor& qkv, const Tensor& q_weight, const Tensor& k_weight,
                             const Tensor& rstd, int n_head);

}  // namespace ptrain
