// What the CUDA backend does when the GPU or its libraries say no, on the simulated device: a
// device that is missing, too old or busy, an arena that is full, operands of the wrong kind, a
// recording CUDA refuses, cuDNN without an engine for the attention graph, cuBLASLt without an
// algorithm for a layer's FP8 GEMMs. A real GPU gives these answers rarely and never on demand;
// the simulation injects them (sim.h, fail_call) so each refusal's handling runs on every commit:
// a fallback where the run can go on, with the reason in its log, and otherwise an error that
// names the device, the sizes or the library call.
#include <catch2/catch.hpp>

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "core/error.h"
#include "sim.h"

namespace ptrain::test {
namespace {

using Catch::Matchers::Contains;

constexpr size_t kMiB = size_t(1) << 20;

// The simulated device's capacity for these tests (ctest sets PTRAIN_SIM_MEMORY to it).
constexpr size_t kCapacity = size_t(4) << 30;

// A device tensor of n f32 elements from the backend's arena.
Tensor device_floats(Backend& be, int64_t n, DType dtype = DType::f32) {
  return Tensor(be.allocate(static_cast<size_t>(n) * dtype_size(dtype)), dtype, {n}, Device::cuda);
}

TEST_CASE("simulated device: a missing, pre-Hopper or busy device is refused, naming it and its free memory", "[sim]") {
  REQUIRE(sim::stats().capacity == kCapacity);
  CHECK_THROWS_WITH(make_cuda_backend(3, 64 * kMiB),
                    Contains("CUDA device 3 does not exist: this machine has 1 CUDA device(s)"));

  sim::set_compute_capability(8, 0);
  CHECK_THROWS_WITH(make_cuda_backend(0, 64 * kMiB),
                    Contains("(ptrain simulated device) is sm_80: ptrain's kernels are built for sm_90 (Hopper) and "
                             "newer; use run.device: cpu"));
  // A newer GPU runs, warned that it takes the kernels from PTX.
  sim::set_compute_capability(10, 0);
  {
    const auto be = make_cuda_backend(0, 64 * kMiB);
    const std::vector<std::string> warnings = be->performance_warnings();
    REQUIRE(warnings.size() == 1);
    CHECK_THAT(warnings[0], Contains("is sm_100 and runs them from PTX compiled by the driver"));
  }
  sim::set_compute_capability(9, 0);

  // An arena larger than the device: cudaMalloc's out-of-memory, with the sizes.
  CHECK_THROWS_WITH(make_cuda_backend(0, 2 * kCapacity),
                    Contains("could not reserve ptrain's CUDA arena of 8589934592 bytes (8.0 GiB; 4.0 GiB free of "
                             "4.0 GiB)") &&
                        Contains("out of GPU memory"));

  // Another process holding memory: the default arena is what is free less the margin for the
  // libraries (2 GiB here), and too little free memory is refused before anything is reserved.
  void* other = nullptr;
  REQUIRE(cudaMalloc(&other, size_t(2560) * kMiB) == cudaSuccess);
  CHECK_THROWS_WITH(make_cuda_backend(0),
                    Contains("CUDA device 0 has only 1.5 GiB free of 4.0 GiB: too little for ptrain's arena"));
  REQUIRE(cudaFree(other) == cudaSuccess);
  REQUIRE(cudaMalloc(&other, 512 * kMiB) == cudaSuccess);
  {
    const auto be = make_cuda_backend(0);
    CHECK(be->memory_use().capacity == size_t(1536) * kMiB);
    const std::vector<std::string> warnings = be->performance_warnings();
    REQUIRE(warnings.size() == 1);
    CHECK_THAT(warnings[0], Contains("only 3.5 GiB of the 4.0 GiB of ptrain simulated device were free when ptrain "
                                     "started: other processes share this GPU"));
  }
  REQUIRE(cudaFree(other) == cudaSuccess);
  CHECK(sim::stats().bytes_in_use == 0);  // every backend gave its arena back
}

TEST_CASE("simulated device: a full arena says what was asked, what is free and what to lower", "[sim]") {
  const auto be = make_cuda_backend(0, 128 * kMiB);
  void* first = be->allocate(60 * kMiB);
  CHECK_THROWS_WITH(be->allocate(60 * kMiB),
                    Contains("out of GPU memory in ptrain's CUDA arena: asked for 62914560 bytes") &&
                        Contains("of the 134217728-byte (0.1 GiB) arena are free") &&
                        Contains("lower training.micro_batch"));
  int not_the_arenas = 0;
  CHECK_THROWS_WITH(be->release(&not_the_arenas), Contains("the pointer was not returned by allocate()"));
  be->release(first);
  void* again = be->allocate(60 * kMiB);  // the freed block merged back: the same memory fits
  CHECK(again == first);
  be->release(again);
}

TEST_CASE("simulated device: operands that are not float tensors in device memory are refused by name", "[sim]") {
  const auto be = make_cuda_backend(0, 128 * kMiB);
  const Tensor out = device_floats(*be, 8);
  std::vector<float> host(8);
  const Tensor on_host(host.data(), DType::f32, {8}, Device::cpu);
  CHECK_THROWS_WITH(be->gelu_forward(out, on_host), "cuda backend gelu_forward: inp is not in device memory");
  CHECK_THROWS_WITH(be->gelu_forward(out, device_floats(*be, 8, DType::f64)), Contains("gelu_forward: inp is f64"));
  CHECK_THROWS_WITH(be->gelu_forward(out, device_floats(*be, 8, DType::i32)),
                    Contains("inp has dtype i32, not f32, bf16 or f16"));
  CHECK_THROWS_WITH(be->gelu_forward(out, Tensor()), Contains("gelu_forward: inp must not be empty"));
  CHECK_THROWS_WITH(be->add(out, out, device_floats(*be, 4)), Contains("add: shape mismatch: a (8), b (4)"));
  CHECK_THROWS_AS(be->storage_for(Format::fp32, DType::f64), UserError);

  // Token ids at or past the vocabulary: refused before the embedding reads out of bounds.
  const Tensor tokens(be->allocate(2 * sizeof(int32_t)), DType::i32, {1, 2}, Device::cuda);
  const int32_t ids[2] = {3, 300};
  be->upload_tokens(tokens, ids);
  const Tensor wte = Tensor(be->allocate(256 * 8 * 4), DType::f32, {256, 8}, Device::cuda);
  const Tensor wpe = Tensor(be->allocate(2 * 8 * 4), DType::f32, {2, 8}, Device::cuda);
  const Tensor emb = Tensor(be->allocate(2 * 8 * 4), DType::f32, {1, 2, 8}, Device::cuda);
  CHECK_THROWS_WITH(be->embedding_forward(emb, tokens, wte, wpe),
                    Contains("token id 300 is not below the 256 rows of the token embedding"));
}

TEST_CASE("simulated device: a recording CUDA refuses is a reason, a failure inside it an error, and recording goes on",
          "[sim]") {
  const auto be = make_cuda_backend(0, 128 * kMiB);
  const Tensor x = device_floats(*be, 1024), y = device_floats(*be, 1024);
  std::vector<float> values(1024, 1.0f), got(1024);
  be->upload(x, values.data());
  std::string why;

  // Reading a result on the host inside the capture synchronises: CUDA refuses, nothing runs.
  CHECK(be->record([&] { (void)be->sum(x); }, &why) == nullptr);
  CHECK_THAT(why, Contains("cudaErrorStreamCapture"));

  // A failure that is not about recording is the caller's: rethrown, the capture ended.
  CHECK_THROWS_WITH(be->record([&] { throw std::runtime_error("a bug in the step"); }, &why), "a bug in the step");

  // A library declining inside the capture (cuBLASLt finding no algorithm) is a refusal too.
  sim::fail_call("cublasLtMatmulAlgoGetHeuristic", 1, CUBLAS_STATUS_NOT_SUPPORTED);
  const Tensor w(be->allocate(48 * 32 * 4), DType::f32, {48, 32}, Device::cuda);
  const Tensor in(x.data, DType::f32, {32, 32}, Device::cuda), mm(y.data, DType::f32, {32, 48}, Device::cuda);
  CHECK(be->record([&] { be->matmul_forward(mm, in, w, Tensor()); }, &why) == nullptr);
  CHECK_THAT(why, Contains("cuBLASLt"));

  // The graph refused when instantiated.
  sim::fail_call("cudaGraphInstantiate", 1, cudaErrorNotSupported);
  CHECK(be->record([&] { be->gelu_forward(y, x); }, &why) == nullptr);
  CHECK_THAT(why, Contains("cudaGraphInstantiate: cudaErrorNotSupported"));

  // And after all of these, a recording is made and replays the work.
  const auto graph = be->record([&] { be->add(y, x, x); }, &why);
  REQUIRE(graph != nullptr);
  be->zero(y);
  graph->replay();
  be->download(got.data(), y);
  CHECK(got == std::vector<float>(1024, 2.0f));
}

TEST_CASE("simulated device: attention falls back with cuDNN's reason when cuDNN cannot run it, or refuses to, and runs grouped K/V heads fused", "[sim]") {
  const auto be = make_cuda_backend(0, 512 * kMiB);
  const auto fallback = AttentionPath::fallback;

  AttentionChoice c = be->choose_attention("fallback", DType::bf16, 1, 64, 2, 2, 32);
  CHECK((c.path == fallback && c.reason == "fallback (model.attention: fallback)"));
  c = be->choose_attention("auto", DType::f32, 1, 64, 2, 2, 32);
  CHECK(c.path == fallback);
  CHECK_THAT(c.reason, Contains("cuDNN's flash attention takes bf16 or fp16; this run's activations are f32"));
  CHECK_THROWS_WITH(be->choose_attention("cudnn", DType::f32, 1, 64, 2, 2, 32),
                    Contains("model.attention: cudnn cannot run this model"));

  // cuDNN that cannot start (no driver, a mismatched sub-library).
  sim::fail_call("cudnnCreate", 1, CUDNN_STATUS_NOT_INITIALIZED);
  c = be->choose_attention("auto", DType::bf16, 1, 64, 2, 2, 32);
  CHECK(c.path == fallback);
  CHECK_THAT(c.reason, Contains("cuDNN could not start"));

  // No engine takes the graph: every execution plan refused as not supported.
  sim::fail_call("cudnnBackendFinalize execution plan", 1, CUDNN_STATUS_NOT_SUPPORTED, 1000);
  c = be->choose_attention("auto", DType::bf16, 1, 64, 2, 2, 32);
  CHECK(c.path == fallback);
  CHECK_THAT(c.reason, Contains("cuDNN found no engine for the forward graph") && Contains("refused"));
  CHECK_THROWS_WITH(be->choose_attention("cudnn", DType::bf16, 1, 64, 2, 2, 32),
                    Contains("model.attention: cudnn cannot run this model: cuDNN found no engine"));
  sim::clear_faults();

  // An engine failing for another reason than support is an error of cuDNN's; `auto` still
  // falls back, naming it.
  sim::fail_call("cudnnBackendFinalize execution plan", 1, CUDNN_STATUS_INTERNAL_ERROR, 1000);
  c = be->choose_attention("auto", DType::bf16, 1, 32, 2, 2, 32);
  CHECK(c.path == fallback);
  CHECK_THAT(c.reason, Contains("cuDNN's attention failed") && Contains("CUDNN_STATUS_INTERNAL_ERROR"));
  sim::clear_faults();

  // The first engine refused, a later one taken: fused, checked against the fallback.
  sim::fail_call("cudnnBackendFinalize execution plan", 1, CUDNN_STATUS_NOT_SUPPORTED, 1);
  c = be->choose_attention("auto", DType::f16, 1, 64, 2, 2, 64);
  CHECK(c.path == AttentionPath::fused);
  CHECK_THAT(c.reason, Contains("checked against the fallback on this shape"));

  // A head size cuDNN's SDPA does not take.
  c = be->choose_attention("auto", DType::bf16, 1, 64, 2, 2, 12);
  CHECK(c.path == fallback);
  CHECK_THAT(c.reason, Contains("head size"));

  // Grouped-query attention (4 query heads over 2 K/V heads, and multi-query over 1): the fused
  // graph reads the K/V heads in place and agrees with the fallback on q, k and v gradients.
  for (const int kv : {2, 1}) {
    c = be->choose_attention("auto", DType::bf16, 2, 64, 4, kv, 32);
    CHECK(c.path == AttentionPath::fused);
    CHECK_THAT(c.reason, Contains("checked against the fallback on this shape") &&
                             Contains("NH=4 KV=" + std::to_string(kv) + " HS=32"));
  }
  // 3 K/V heads cannot serve 4 query heads (config validation refuses it first; cuDNN's
  // shape check says so too).
  c = be->choose_attention("auto", DType::bf16, 1, 64, 4, 3, 32);
  CHECK(c.path == fallback);
  CHECK_THAT(c.reason, Contains("3 K/V heads do not divide 4 query heads"));
}

TEST_CASE("simulated device: a layer whose FP8 GEMMs cuBLASLt cannot run is left to the emulation, with the reason",
          "[sim]") {
  const auto be = make_cuda_backend(0, 512 * kMiB);
  using Scaling = Fp8Gemms::Scaling;
  std::string why;
  CHECK(be->make_fp8_gemms(64, 40, 64, Scaling::tensor, Format::e4m3, Format::e5m2, &why) == nullptr);
  CHECK_THAT(why, Contains("this layer's shape does not suit cuBLASLt's FP8 GEMMs"));
  CHECK(be->make_fp8_gemms(128, 192, 128, Scaling::blocks, Format::e4m3, Format::e4m3, &why) == nullptr);
  CHECK_THAT(why, Contains("this layer's shape does not suit cuBLASLt's FP8 GEMMs"));
  CHECK(be->make_fp8_gemms(64, 64, 64, Scaling::tensor, Format::e5m2, Format::e5m2, &why) == nullptr);
  CHECK_THAT(why, Contains("e5m2"));

  const size_t before = be->memory_use().in_use;
  sim::fail_call("cublasLtMatmulAlgoGetHeuristic", 1, CUBLAS_STATUS_NOT_SUPPORTED);
  CHECK(be->make_fp8_gemms(64, 64, 64, Scaling::tensor, Format::e4m3, Format::e5m2, &why) == nullptr);
  CHECK_THAT(why, Contains("cuBLASLt on this GPU has no algorithm for the forward GEMM"));
  CHECK(be->memory_use().in_use == before);  // the refused layer's buffers were given back

  // cuBLASLt refusing at launch what its heuristic offered: the layer's one launch of each GEMM
  // finds it, so training never meets it (the 1st launch is the forward GEMM's, the 3rd wgrad's).
  // Shapes not asked before: a refusal by the heuristic is remembered per shape.
  for (const auto& [nth, gemm, C] : {std::tuple{1, "forward", 128}, std::tuple{3, "wgrad", 160}}) {
    sim::fail_call("cublasLtMatmul", nth, CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK(be->make_fp8_gemms(64, C, 64, Scaling::tensor, Format::e4m3, Format::e5m2, &why) == nullptr);
    CHECK_THAT(why, Contains(std::string("cuBLASLt refused to launch the ") + gemm + " GEMM") &&
                        Contains("that its heuristic had offered"));
    CHECK(be->memory_use().in_use == before);
    sim::clear_faults();
  }

  CHECK(be->make_fp8_gemms(64, 96, 64, Scaling::tensor, Format::e4m3, Format::e5m2, &why) != nullptr);
}

TEST_CASE("simulated device: cuDNN 9.15.0 and older keep a sequence length that is not a multiple of 128 off "
          "the fused attention",
          "[sim]") {
  // cudnn-frontend adds a padding mask to the backward there (an invalid memory access otherwise,
  // fixed in cuDNN 9.15.1); ptrain's graph has none, so the fallback runs such shapes.
  for (const auto& [version, T, fused] : {std::tuple{"91500", 64, false}, std::tuple{"91500", 128, true},
                                          std::tuple{"91501", 64, true}}) {
    CAPTURE(version, T);
    REQUIRE(setenv("PTRAIN_SIM_CUDNN_VERSION", version, 1) == 0);
    const auto be = make_cuda_backend(0, 512 * kMiB);
    const AttentionChoice c = be->choose_attention("auto", DType::bf16, 1, T, 2, 2, 32);
    CHECK((c.path == AttentionPath::fused) == fused);
    if (!fused)
      CHECK_THAT(c.reason, Contains("cuDNN 9.15.0 can fault in the attention backward when the sequence length (64) "
                                    "is not a multiple of 128"));
  }
  unsetenv("PTRAIN_SIM_CUDNN_VERSION");
}

}  // namespace
}  // namespace ptrain::test
