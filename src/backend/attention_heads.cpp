#include "backend/attention_heads.h"

#include <string>

#include "core/error.h"

namespace ptrain {

AttentionHeads attention_heads(const char* op, const Tensor& qkv, const Tensor& out, int n_head) {
  const AttentionHeads heads =
      qkv.ndim >= 1 && out.ndim >= 1 ? AttentionHeads::of(qkv.dim(-1), out.dim(-1), n_head) : AttentionHeads{};
  PTRAIN_CHECK(heads.valid(), std::string(op) + ": qkv " + qkv.shape_string() + " and output " + out.shape_string() +
                                  " are not " + std::to_string(n_head) +
                                  " query heads over K/V heads that divide them (want qkv rows (n_head + 2 n_kv_head) "
                                  "head_size wide, output rows n_head head_size)");
  return heads;
}

AttentionHeads qk_norm_heads(const char* op, const Tensor& qkv, const Tensor& q_weight, const Tensor& k_weight,
                             const Tensor& rstd, int n_head) {
  const int64_t hs = q_weight.numel();
  const AttentionHeads heads = qkv.ndim >= 1 ? AttentionHeads::of(qkv.dim(-1), n_head * hs, n_head) : AttentionHeads{};
  const int64_t rows = heads.valid() ? qkv.numel() / qkv.dim(-1) : 0;
  PTRAIN_CHECK(heads.valid() && k_weight.numel() == hs && rstd.numel() == rows * (heads.n_head + heads.n_kv_head),
               std::string(op) + ": qkv " + qkv.shape_string() + ", q and k norm weights " + q_weight.shape_string() +
                   " and " + k_weight.shape_string() + " and rstd " + rstd.shape_string() + " are not " +
                   std::to_string(n_head) +
                   " query heads over K/V heads that divide them (want qkv rows (n_head + 2 n_kv_head) head_size "
                   "wide, both weights head_size, rstd rows (n_head + n_kv_head))");
  return heads;
}

}  // namespace ptrain
