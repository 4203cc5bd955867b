// Why the CPU's results cannot depend on the thread count, on any CPU: a training micro-batch
// makes the same BLAS calls (shapes, operand offsets, scalars), each single-threaded, at 1, 2 and
// 3 threads. A machine whose OpenBLAS kernels sum differently per thread count (AMD's Zen
// kernels) then still gives identical losses; a developer on another CPU sees the property here.
#include <catch2/catch.hpp>
#include <omp.h>

#include <cstring>

#include "backend/backend.h"
#include "backend/cpu/gemm.h"
#include "model/transformer.h"
#include "test_util.h"

using namespace ptrain;

namespace {

struct MicroBatchTrace {
  std::vector<GemmCall> calls;
  double loss = 0;
  std::vector<float> grads;
};

// One forward and backward pass of a small GPT whose GEMMs are cut into several panels (512
// tokens, a 384-row padded vocabulary), on a CPU backend with `threads` threads.
MicroBatchTrace trace_micro_batch(int threads) {
  auto backend = make_cpu_backend(threads);
  const ModelShape shape{2, 2, 64, 64, 300, 384};  // L, NH, C, max T, V, Vp
  const int B = 8, T = 64;
  Transformer model(shape, *backend, DType::f32, B, T);
  model.init(5);
  Rng rng(9);
  std::vector<int32_t> inputs(B * T), targets(B * T);
  for (auto& t : inputs) t = static_cast<int32_t>(rng.below(shape.vocab));
  for (auto& t : targets) t = static_cast<int32_t>(rng.below(shape.vocab));
  MicroBatchTrace trace;
  model.zero_grad();
  start_recording_gemm_calls();
  trace.loss = model.forward(inputs.data(), targets.data(), 1.0f / (B * T));
  model.backward();
  trace.calls = stop_recording_gemm_calls();
  const Tensor g = model.grads_flat();
  trace.grads.assign(g.as<float>(), g.as<float>() + g.numel());
  return trace;
}

}  // namespace

TEST_CASE("a micro-batch makes the same single-threaded BLAS calls at 1, 2 and 3 threads", "[determinism]") {
  const int threads_before = omp_get_max_threads();
  const MicroBatchTrace one = trace_micro_batch(1), two = trace_micro_batch(2), three = trace_micro_batch(3);
  omp_set_num_threads(threads_before);

  REQUIRE(!one.calls.empty());
  // Some GEMMs really are cut (else the test would show nothing about sharing panels).
  int64_t cut = 0;
  for (size_t i = 1; i < one.calls.size(); ++i) cut += one.calls[i].gemm == one.calls[i - 1].gemm;
  CHECK(cut > 0);
  for (const MicroBatchTrace* t : {&one, &two, &three}) {
    REQUIRE(t->calls.size() == one.calls.size());
    for (size_t i = 0; i < one.calls.size(); ++i) {
      CAPTURE(i, t->calls[i].gemm, t->calls[i].M, t->calls[i].N, t->calls[i].K, t->calls[i].c_offset);
      CHECK(t->calls[i].single_threaded);
      CHECK(t->calls[i] == one.calls[i]);
    }
  }
  // And so the numbers agree bit for bit.
  CHECK(std::memcmp(&one.loss, &two.loss, sizeof(double)) == 0);
  CHECK(std::memcmp(&one.loss, &three.loss, sizeof(double)) == 0);
  CHECK(one.grads == two.grads);
  CHECK(one.grads == three.grads);
}
