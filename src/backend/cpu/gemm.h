// The CPU backend's GEMMs, in a decomposition fixed by the shape alone. OpenBLAS's threaded
// GEMMs split the work by thread count, and on some CPUs (its Zen kernels, for one) that changes
// the summation order: one and two threads then give results a few ulps apart. Here each GEMM is
// cut into fixed panels of output rows or columns, each panel is one single-threaded BLAS call
// over the whole inner dimension, and OpenMP shares the panels among threads. The same calls
// with the same operands run whatever the thread count, so the result cannot depend on it.
#pragma once

#include <cstdint>
#include <vector>

namespace ptrain {

// C(M,N) = alpha * op(A) op(B) + beta * C, row-major, op(X) = X or X^T.
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, double alpha, const double* A,
          int64_t lda, const double* B, int64_t ldb, double beta, double* C, int64_t ldc);

// For ops that share many small independent GEMMs among threads themselves (attention: one
// (batch, head) per iteration of a parallel loop): one BLAS call on the calling thread, which
// must be inside an OpenMP parallel region without an `if` clause (OpenBLAS threads a call made
// outside an active one unless OpenMP has one thread). `id` numbers the call for the recording;
// reserve_gemm_ids, on the thread that starts the loop, hands out a block of them, so that
// recordings compare between thread counts.
int64_t reserve_gemm_ids(int64_t count);
void serial_gemm(int64_t id, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                 int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);
void serial_gemm(int64_t id, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, double alpha,
                 const double* A, int64_t lda, const double* B, int64_t ldb, double beta, double* C, int64_t ldc);

// The second numerics (tests): with PTRAIN_GEMM_ULP_SEED set to a non-zero integer, every result
// of these GEMMs is moved by -1, 0 or +1 ulp, chosen by a hash of the seed, the result's bits and
// its row and column in the GEMM's output. That is what another CPU's BLAS kernel (another
// summation order) could return, so a test that holds only on this machine's rounding fails
// under it; and being a pure function of value and position it keeps every run deterministic,
// so runs compared bit for bit (at any thread count, resumed or not) still agree. Zero, infinite
// and NaN results stay as they are. Returns the seed (0: off); a value that is not an integer is
// bad input (UserError), which `ptrain` reports before any command runs.
uint64_t gemm_ulp_seed();

// One BLAS call a GEMM was cut into: its shape, and where its operands start relative to the
// whole GEMM's (in elements), so calls can be compared between runs and thread counts.
struct GemmCall {
  int64_t gemm = 0;  // which gemm() call (or serial_gemm id) of the recording this belongs to
  bool f64 = false, trans_a = false, trans_b = false;
  int64_t M = 0, N = 0, K = 0, lda = 0, ldb = 0, ldc = 0;
  int64_t a_offset = 0, b_offset = 0, c_offset = 0;
  double alpha = 0, beta = 0;
  bool single_threaded = false;  // BLAS ran it on one thread (inside an active parallel region, or one thread)
  bool operator==(const GemmCall& o) const;
  bool operator<(const GemmCall& o) const;
};

// Starts recording every BLAS call the GEMMs make (tests); stop_recording returns them sorted by
// (gemm, offsets), an order that does not depend on which thread ran which panel.
void start_recording_gemm_calls();
std::vector<GemmCall> stop_recording_gemm_calls();

}  // namespace ptrain
