// The CPU backend's fused classifier: softmax over the vocabulary, the loss, and the logits'
// gradient written in place. One row (the padded vocabulary: 201 KB for GPT-2's) stays in the
// core's L2 cache across its passes; the exps are vectorised (vector_math.h) and summed in fixed
// lanes, so a row's softmax and gradient are the same on every CPU and thread count (the loss
// takes the library's log of the sum).
#pragma once

#include <cmath>
#include <cstdint>

#include "backend/cpu/layer_ops.h"
#include "backend/cpu/vector_math.h"

namespace ptrain {
namespace cpu {

// losses[n] = -log softmax(logits[n])[targets[n]] over the first V of Vp columns; with dloss != 0
// the row becomes dloss * (softmax - onehot(target)), and the padding columns 0.
template <typename T>
void classifier(T* logits, T* losses, const int32_t* targets, int64_t N, int64_t Vp, int64_t V, T dloss) {
#pragma omp parallel for schedule(static) if (worth_threads(N * Vp))
  for (int64_t n = 0; n < N; ++n) {
    T* row = logits + n * Vp;
    const T maxv = vmath::row_max(row, V);
    const int64_t target = targets[n];
    const T target_logit = row[target];
    const T sum = vmath::exp_in_place(row, V, maxv);  // the row now holds the softmax numerators
    losses[n] = std::log(sum) - (target_logit - maxv);
    const T scale = dloss / sum;
    for (int64_t i = 0; i < V; ++i) row[i] *= scale;
    row[target] -= dloss;
    for (int64_t i = V; i < Vp; ++i) row[i] = 0;
  }
}

}  // namespace cpu
}  // namespace ptrain
