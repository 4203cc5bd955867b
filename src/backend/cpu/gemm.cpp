#include "backend/cpu/gemm.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <mutex>
#include <string>
#include <tuple>

#include "core/error.h"

namespace ptrain {
namespace {

// Rows (or columns) of C per BLAS call, a multiple of 64 fixed by the shape alone (never by the
// thread count). Long sides make about kTargetPanels panels: each call packs the operand all
// panels share once more, so fewer, larger panels pack less (the LM head's forward, 50304
// columns, packed the 1 MiB of activations 197 times in 256-column panels and ran 95 -> 110
// GFLOP/s in 2112-column ones on 2 Zen 3 cores). Sides from 256 to 6144 make kMinPanels or more,
// up to 256 wide, so that a 256- or 768-row GEMM still keeps several threads busy. About 24
// panels load 2, 3, 4, 6, 8, 12 or 24 threads evenly.
constexpr int64_t kTargetPanels = 24, kMinPanels = 4, kSmallPanel = 256;

int64_t panel_size(int64_t extent) {
  const auto multiple_of_64 = [](int64_t x) { return std::max<int64_t>(64, (x + 63) / 64 * 64); };
  const int64_t long_side = multiple_of_64((extent + kTargetPanels - 1) / kTargetPanels);
  const int64_t short_side = std::min(kSmallPanel, multiple_of_64((extent + kMinPanels - 1) / kMinPanels));
  return std::max(long_side, short_side);
}

// PTRAIN_GEMM_ULP_SEED, read once. A malformed value leaves the mode off here and is reported by
// gemm_ulp_seed(), which ptrain calls before any command (the GEMMs cannot throw: some run
// inside parallel regions).
struct UlpMode {
  uint64_t seed = 0;
  std::string error;
};

const UlpMode& ulp_mode() {
  static const UlpMode mode = [] {
    UlpMode m;
    const char* text = std::getenv("PTRAIN_GEMM_ULP_SEED");
    if (!text || !*text) return m;
    char* end = nullptr;
    errno = 0;
    const unsigned long long v = std::strtoull(text, &end, 10);
    if (*end != '\0' || errno != 0 || !std::isdigit(static_cast<unsigned char>(text[0])))  // no sign or space
      m.error = std::string("PTRAIN_GEMM_ULP_SEED: \"") + text + "\" is not a seed; expected a non-negative integer (0 or unset: off)";
    else
      m.seed = v;
    return m;
  }();
  return mode;
}

uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

template <typename T>
uint64_t bits_of(T v) {
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof v);
  return b;
}

// C's m x n block, whose first element is row `row0`, column `col0` of the whole GEMM's output.
template <typename T>
void shift_by_ulps(uint64_t seed, int64_t m, int64_t n, T* C, int64_t ldc, int64_t row0, int64_t col0) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      T& v = C[i * ldc + j];
      if (v == T(0) || !std::isfinite(v)) continue;
      const uint64_t h = mix(seed ^ mix(bits_of(v) ^ mix(static_cast<uint64_t>(row0 + i) * 0x9e3779b97f4a7c15ULL +
                                                         static_cast<uint64_t>(col0 + j))));
      const int step = static_cast<int>(h % 3) - 1;
      if (step == 0) continue;
      // std::nextafter towards +-infinity, without its call: a finite non-zero value's
      // neighbour is one step of its bit pattern, up in magnitude when the step goes its sign's
      // way (the largest finite value's neighbour, infinity, is not taken).
      using Bits = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
      Bits b;
      std::memcpy(&b, &v, sizeof b);
      b = (step > 0) == (v > T(0)) ? b + 1 : b - 1;
      T moved;
      std::memcpy(&moved, &b, sizeof b);
      if (std::isfinite(moved)) v = moved;
    }
}

struct Recording {
  std::atomic<bool> on{false};
  std::mutex mutex;
  int64_t next_gemm = 0;
  std::vector<GemmCall> calls;
};

Recording& recording() {
  static Recording r;
  return r;
}

// A single row of C (decoding's one position) is a matrix-vector product: gemv reads the
// matrix once, where gemm would first pack all of it (40% of a GPT-2-vocabulary decoding step
// went to packing the LM head).
void blas(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B,
          int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 1) {
    // C (1,N) = op(B)^T x with x the row of op(A): B is (K,N), or (N,K) when transposed.
    cblas_sgemv(CblasRowMajor, tb ? CblasNoTrans : CblasTrans, tb ? N : K, tb ? K : N, alpha, B, ldb, A,
                ta ? lda : 1, beta, C, 1);
    return;
  }
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B,
              ldb, beta, C, ldc);
}

void blas(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A, int64_t lda,
          const double* B, int64_t ldb, double beta, double* C, int64_t ldc) {
  if (M == 1) {
    cblas_dgemv(CblasRowMajor, tb ? CblasNoTrans : CblasTrans, tb ? N : K, tb ? K : N, alpha, B, ldb, A,
                ta ? lda : 1, beta, C, 1);
    return;
  }
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B,
              ldb, beta, C, ldc);
}

template <typename T>
void record_call(int64_t id, bool ta, bool tb, int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb, int64_t ldc,
                 int64_t a_off, int64_t b_off, int64_t c_off, T alpha, T beta) {
  GemmCall call{id, sizeof(T) == 8, ta, tb, m, n, k, lda, ldb, ldc, a_off, b_off, c_off,
                static_cast<double>(alpha), static_cast<double>(beta),
                omp_in_parallel() != 0 || omp_get_max_threads() == 1};
  Recording& rec = recording();
  std::lock_guard<std::mutex> lock(rec.mutex);
  rec.calls.push_back(call);
}

template <typename T>
void panelled_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda, const T* B,
                   int64_t ldb, T beta, T* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  Recording& rec = recording();
  const bool recording_on = rec.on.load();
  const uint64_t ulp_seed = ulp_mode().seed;
  int64_t gemm_index = 0;
  if (recording_on) {
    std::lock_guard<std::mutex> lock(rec.mutex);
    gemm_index = rec.next_gemm++;
  }
  // Cut the longer side of C, so a GEMM with few rows (a small batch) still makes panels.
  const bool by_rows = M >= N;
  const int64_t extent = by_rows ? M : N, panel = panel_size(extent);
  const int64_t panels = (extent + panel - 1) / panel;
  // No `if` clause: OpenBLAS (OpenMP build) runs single-threaded only inside an active parallel
  // region, or when OpenMP has one thread. An inactive region would let it thread a panel.
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < panels; ++p) {
    const int64_t lo = p * panel, n = std::min(extent, lo + panel) - lo;
    // Rows lo.. of C: rows of op(A); columns lo.. of C: columns of op(B).
    const int64_t a_off = by_rows ? (ta ? lo : lo * lda) : 0;
    const int64_t b_off = by_rows ? 0 : (tb ? lo * ldb : lo);
    const int64_t c_off = by_rows ? lo * ldc : lo;
    const int64_t m = by_rows ? n : M, cols = by_rows ? N : n;
    blas(ta, tb, m, cols, K, alpha, A + a_off, lda, B + b_off, ldb, beta, C + c_off, ldc);
    if (ulp_seed) shift_by_ulps(ulp_seed, m, cols, C + c_off, ldc, by_rows ? lo : 0, by_rows ? 0 : lo);
    if (recording_on) record_call(gemm_index, ta, tb, m, cols, K, lda, ldb, ldc, a_off, b_off, c_off, alpha, beta);
  }
}

auto key(const GemmCall& c) {
  return std::tie(c.gemm, c.f64, c.trans_a, c.trans_b, c.M, c.N, c.K, c.lda, c.ldb, c.ldc, c.a_offset, c.b_offset,
                  c.c_offset, c.alpha, c.beta, c.single_threaded);
}

}  // namespace

bool GemmCall::operator==(const GemmCall& o) const { return key(*this) == key(o); }
bool GemmCall::operator<(const GemmCall& o) const { return key(*this) < key(o); }

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
          const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  panelled_gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, double alpha, const double* A, int64_t lda,
          const double* B, int64_t ldb, double beta, double* C, int64_t ldc) {
  panelled_gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

uint64_t gemm_ulp_seed() {
  const UlpMode& m = ulp_mode();
  if (!m.error.empty()) throw UserError(m.error);
  return m.seed;
}

int64_t reserve_gemm_ids(int64_t count) {
  Recording& rec = recording();
  if (!rec.on.load()) return 0;
  std::lock_guard<std::mutex> lock(rec.mutex);
  const int64_t first = rec.next_gemm;
  rec.next_gemm += count;
  return first;
}

void serial_gemm(int64_t id, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                 int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  blas(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  if (const uint64_t seed = ulp_mode().seed) shift_by_ulps(seed, M, N, C, ldc, 0, 0);
  if (recording().on.load()) record_call(id, trans_a, trans_b, M, N, K, lda, ldb, ldc, 0, 0, 0, alpha, beta);
}

void serial_gemm(int64_t id, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, double alpha,
                 const double* A, int64_t lda, const double* B, int64_t ldb, double beta, double* C, int64_t ldc) {
  blas(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  if (const uint64_t seed = ulp_mode().seed) shift_by_ulps(seed, M, N, C, ldc, 0, 0);
  if (recording().on.load()) record_call(id, trans_a, trans_b, M, N, K, lda, ldb, ldc, 0, 0, 0, alpha, beta);
}

void start_recording_gemm_calls() {
  Recording& rec = recording();
  std::lock_guard<std::mutex> lock(rec.mutex);
  rec.calls.clear();
  rec.next_gemm = 0;
  rec.on = true;
}

std::vector<GemmCall> stop_recording_gemm_calls() {
  Recording& rec = recording();
  std::lock_guard<std::mutex> lock(rec.mutex);
  rec.on = false;
  std::vector<GemmCall> calls = std::move(rec.calls);
  rec.calls.clear();
  std::sort(calls.begin(), calls.end());
  return calls;
}

}  // namespace ptrain
