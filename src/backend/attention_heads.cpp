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

}  // namespace ptrain
