// The CPU backend's causal attention, as GEMMs: for each (batch, head), scores = scale Q K^T,
// a causal softmax row by row, out = P V; backward dP = dO V^T, dS through the softmax, then
// dQ += dS K, dK += dS^T Q, dV += P^T dO. The query rows go in blocks of kAttentionRows, and a
// block's products stop at its last key, so the masked upper triangle costs little. The
// (batch, head) pairs are shared among threads, each one's BLAS calls made on one thread in a
// fixed sequence (gemm.h, serial_gemm), so the thread count never changes a result.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "backend/attention_heads.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/vector_math.h"

namespace ptrain {
namespace cpu {

constexpr int64_t kAttentionRows = 64;

// qkv is (B, T, W) in the layout of AttentionHeads (W = 3C for GPT-2): row t of (batch b, query
// head h) starts at qkv + (b T + t) W + h hs for Q, at k_offset(h) for its K and v_offset(h) for
// its V; out and dout are (B, T, C), C = NH hs; att, the saved probabilities, is (B, NH, T, T).
template <typename T>
void attention_forward(T* out, T* att, const T* qkv, int64_t B, int64_t Tn, const AttentionHeads& heads) {
  const int64_t NH = heads.n_head, hs = heads.head_size, C = heads.q_width(), ld = heads.row_width();
  const int64_t blocks = (Tn + kAttentionRows - 1) / kAttentionRows;
  const T scale = 1 / std::sqrt(static_cast<T>(hs));
  const int64_t ids = reserve_gemm_ids(B * NH * 2 * blocks);
  // No `if` clause: serial_gemm needs an active parallel region (gemm.h).
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < B * NH; ++bh) {
    const int64_t b = bh / NH, h = bh % NH;
    const T* q = qkv + b * Tn * ld + h * hs;
    const T* k = qkv + b * Tn * ld + heads.k_offset(h);
    const T* v = qkv + b * Tn * ld + heads.v_offset(h);
    T* p = att + bh * Tn * Tn;
    T* o = out + b * Tn * C + h * hs;
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int64_t r0 = blk * kAttentionRows, r1 = std::min(Tn, r0 + kAttentionRows), rows = r1 - r0;
      const int64_t id = ids + (bh * blocks + blk) * 2;
      serial_gemm(id, false, true, rows, r1, hs, scale, q + r0 * ld, ld, k, ld, T(0), p + r0 * Tn, Tn);
      for (int64_t t = r0; t < r1; ++t) {
        T* row = p + t * Tn;
        const T sum = vmath::exp_in_place(row, t + 1, vmath::row_max(row, t + 1));
        const T inv = 1 / sum;
        for (int64_t t2 = 0; t2 <= t; ++t2) row[t2] *= inv;
        for (int64_t t2 = t + 1; t2 < Tn; ++t2) row[t2] = 0;
      }
      serial_gemm(id + 1, false, false, rows, hs, r1, T(1), p + r0 * Tn, Tn, v, ld, T(0), o + r0 * C, C);
    }
  }
}

// One query over cached keys and values (incremental decoding): qkv (n, W) holds rows 0..n-1
// of one sequence; out (C) is row n-1 of attention_forward's output, computed as it is (the
// scores, then the softmax of vector_math.h, then the probabilities times V) without the other
// rows. A loop per head: one query row is a matrix-vector product, too small for BLAS panels.
template <typename T>
void attention_decode(T* out, const T* qkv, int64_t n, const AttentionHeads& heads) {
  const int64_t NH = heads.n_head, hs = heads.head_size, ld = heads.row_width();
  const T scale = 1 / std::sqrt(static_cast<T>(hs));
  const T* q = qkv + (n - 1) * ld;
#pragma omp parallel
  {
    std::vector<T> p(static_cast<size_t>(n));
#pragma omp for schedule(static)
    for (int64_t h = 0; h < NH; ++h) {
      for (int64_t j = 0; j < n; ++j) {
        const T* k = qkv + j * ld + heads.k_offset(h);
        T dot = 0;
        for (int64_t d = 0; d < hs; ++d) dot += q[h * hs + d] * k[d];
        p[j] = scale * dot;
      }
      const T inv = 1 / vmath::exp_in_place(p.data(), n, vmath::row_max(p.data(), n));
      T* o = out + h * hs;
      for (int64_t d = 0; d < hs; ++d) o[d] = 0;
      for (int64_t j = 0; j < n; ++j) {
        const T w = p[j] * inv;
        const T* v = qkv + j * ld + heads.v_offset(h);
        for (int64_t d = 0; d < hs; ++d) o[d] += w * v[d];
      }
    }
  }
}

// Accumulates into dqkv (the caller zeroes it). The query heads that share a K/V head run one
// after another on one thread, so their sums into dK and dV have a fixed order.
template <typename T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* att, int64_t B, int64_t Tn,
                        const AttentionHeads& heads) {
  const int64_t NH = heads.n_head, KV = heads.n_kv_head, hs = heads.head_size, C = heads.q_width();
  const int64_t ld = heads.row_width(), blocks = (Tn + kAttentionRows - 1) / kAttentionRows;
  const T scale = 1 / std::sqrt(static_cast<T>(hs));
  const int64_t ids = reserve_gemm_ids(B * NH * 4 * blocks);
#pragma omp parallel
  {
    std::vector<T> ds(static_cast<size_t>(Tn * Tn));  // this thread's dP, then dS, of one (b, h)
#pragma omp for schedule(static)
    for (int64_t bkv = 0; bkv < B * KV; ++bkv) {
      const int64_t b = bkv / KV;
      for (int64_t h = bkv % KV * heads.group(); h < (bkv % KV + 1) * heads.group(); ++h) {
        const int64_t bh = b * NH + h;
        const T* q = qkv + b * Tn * ld + h * hs;
        const T* k = qkv + b * Tn * ld + heads.k_offset(h);
        const T* v = qkv + b * Tn * ld + heads.v_offset(h);
        T* dq = dqkv + b * Tn * ld + h * hs;
        T* dk = dqkv + b * Tn * ld + heads.k_offset(h);
        T* dv = dqkv + b * Tn * ld + heads.v_offset(h);
        const T* p = att + bh * Tn * Tn;
        const T* d = dout + b * Tn * C + h * hs;
        for (int64_t blk = 0; blk < blocks; ++blk) {
          const int64_t r0 = blk * kAttentionRows, r1 = std::min(Tn, r0 + kAttentionRows), rows = r1 - r0;
          const int64_t id = ids + (bh * blocks + blk) * 4;
          serial_gemm(id, false, true, rows, r1, hs, T(1), d + r0 * C, C, v, ld, T(0), ds.data() + r0 * Tn, Tn);
          // Through the softmax: dS = P (dP - sum(P dP)), times the scores' scale; 0 above the
          // diagonal up to the block's last key (columns beyond are never read for these rows).
          for (int64_t t = r0; t < r1; ++t) {
            const T* pr = p + t * Tn;
            T* dr = ds.data() + t * Tn;
            T pdp = 0;
            for (int64_t t2 = 0; t2 <= t; ++t2) pdp += pr[t2] * dr[t2];
            for (int64_t t2 = 0; t2 <= t; ++t2) dr[t2] = pr[t2] * (dr[t2] - pdp) * scale;
            for (int64_t t2 = t + 1; t2 < r1; ++t2) dr[t2] = 0;
          }
          serial_gemm(id + 1, false, false, rows, hs, r1, T(1), ds.data() + r0 * Tn, Tn, k, ld, T(1), dq + r0 * ld,
                      ld);
        }
        // Keys and values c0.. of block blk take from queries c0.. (the later rows): dK += dS^T Q
        // and dV += P^T dO over those rows.
        for (int64_t blk = 0; blk < blocks; ++blk) {
          const int64_t c0 = blk * kAttentionRows, cols = std::min(Tn, c0 + kAttentionRows) - c0, rows = Tn - c0;
          const int64_t id = ids + (bh * blocks + blk) * 4 + 2;
          serial_gemm(id, true, false, cols, hs, rows, T(1), ds.data() + c0 * Tn + c0, Tn, q + c0 * ld, ld, T(1),
                      dk + c0 * ld, ld);
          serial_gemm(id + 1, true, false, cols, hs, rows, T(1), p + c0 * Tn + c0, Tn, d + c0 * C, C, T(1),
                      dv + c0 * ld, ld);
        }
      }
    }
  }
}

}  // namespace cpu
}  // namespace ptrain
