// What the CUDA backend does when the GPU or its libraries say no, on the simulated device: a
// device that is missing, too old or busy, an arena that is full, operands of the wrong kind, a
// recording CUDA refuses, cuDNN without an engine for the attention graph, cuBLASLt without an
// algorithm for a layer's FP8 GEMMs. A real GPU gives these answers rarely and never on demand;
// the simulation injects them (sim.h, fail_call) so each refusal's handling runs on every commit:
// a fallback where the run can go on, with the reason in its log, and otherwise an error that
// names the device, the sizes or the library call. The simulated cuDNN's own refusal of
// attention graphs its fused engines do not take is tested at the end, on graphs built through
// the backend API directly for the shapes ptrain refuses before asking.
#include <catch2/catch.hpp>

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "core/error.h"
#include "sim.h"

namespace ptrain::test {
namespace {

using Catch::Matchers::Contains;

constexpr size_t kMiB = size_t(1) << 20;

// The cuDNN version the simulated cuDNN reports, for the scope of one test (however it ends).
struct SimulatedCudnnVersion {
  explicit SimulatedCudnnVersion(const char* version) { setenv("PTRAIN_SIM_CUDNN_VERSION", version, 1); }
  ~SimulatedCudnnVersion() { unsetenv("PTRAIN_SIM_CUDNN_VERSION"); }
};
// The simulated GPU's compute capability, sm_90 again however the test ends.
struct SimulatedComputeCapability {
  SimulatedComputeCapability(int major, int minor) { sim::set_compute_capability(major, minor); }
  ~SimulatedComputeCapability() { sim::set_compute_capability(9, 0); }
};

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
  CHECK_THROWS_AS(be->storage_for(Format::fp32, DType::f64), std::logic_error);  // a bug, not bad input

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

  AttentionChoice c = be->choose_attention(AttentionRequest::fallback, DType::bf16, 1, 64, 2, 2, 32);
  CHECK((c.path == fallback && c.reason == "fallback (model.attention: fallback)"));
  c = be->choose_attention(AttentionRequest::auto_, DType::f32, 1, 64, 2, 2, 32);
  CHECK(c.path == fallback);
  CHECK_THAT(c.reason, Contains("cuDNN's flash attention takes bf16 or fp16; this run's activations are f32"));
  CHECK_THROWS_WITH(be->choose_attention(AttentionRequest::cudnn, DType::f32, 1, 64, 2, 2, 32),
                    Contains("model.attention: cudnn cannot run this model"));

  // cuDNN that cannot start (no driver, a mismatched sub-library).
  sim::fail_call("cudnnCreate", 1, CUDNN_STATUS_NOT_INITIALIZED);
  c = be->choose_attention(AttentionRequest::auto_, DType::bf16, 1, 64, 2, 2, 32);
  CHECK(c.path == fallback);
  CHECK_THAT(c.reason, Contains("cuDNN could not start"));

  // No engine takes the graph: every execution plan refused as not supported.
  sim::fail_call("cudnnBackendFinalize execution plan", 1, CUDNN_STATUS_NOT_SUPPORTED, 1000);
  c = be->choose_attention(AttentionRequest::auto_, DType::bf16, 1, 64, 2, 2, 32);
  CHECK(c.path == fallback);
  CHECK_THAT(c.reason, Contains("cuDNN found no engine for the forward graph") && Contains("refused"));
  CHECK_THROWS_WITH(be->choose_attention(AttentionRequest::cudnn, DType::bf16, 1, 64, 2, 2, 32),
                    Contains("model.attention: cudnn cannot run this model: cuDNN found no engine"));
  sim::clear_faults();

  // An engine failing for another reason than support is an error of cuDNN's; `auto` still
  // falls back, naming it.
  sim::fail_call("cudnnBackendFinalize execution plan", 1, CUDNN_STATUS_INTERNAL_ERROR, 1000);
  c = be->choose_attention(AttentionRequest::auto_, DType::bf16, 1, 32, 2, 2, 32);
  CHECK(c.path == fallback);
  CHECK_THAT(c.reason, Contains("cuDNN's attention failed") && Contains("CUDNN_STATUS_INTERNAL_ERROR"));
  sim::clear_faults();

  // The first engine refused, a later one taken: fused, checked against the fallback.
  sim::fail_call("cudnnBackendFinalize execution plan", 1, CUDNN_STATUS_NOT_SUPPORTED, 1);
  c = be->choose_attention(AttentionRequest::auto_, DType::f16, 1, 64, 2, 2, 64);
  CHECK(c.path == AttentionPath::fused);
  CHECK_THAT(c.reason, Contains("checked against the fallback on this shape"));

  // A head size cuDNN's SDPA does not take.
  c = be->choose_attention(AttentionRequest::auto_, DType::bf16, 1, 64, 2, 2, 12);
  CHECK(c.path == fallback);
  CHECK_THAT(c.reason, Contains("head size"));
  // One ptrain lets through to cuDNN, above the 256 Hopper's engines take: every engine refuses
  // the plan, and cuDNN's own reason is the run's; 256 itself runs fused.
  c = be->choose_attention(AttentionRequest::auto_, DType::bf16, 1, 64, 2, 2, 264);
  CHECK(c.path == fallback);
  CHECK_THAT(c.reason, Contains("cuDNN found no engine for the forward graph of B=1 T=64 NH=2 HS=264 bf16") &&
                           Contains("engine 0: CUDNN_STATUS_NOT_SUPPORTED_SHAPE (fused flash attention (forward): "
                                    "head dimension 264 above the 256"));
  c = be->choose_attention(AttentionRequest::auto_, DType::bf16, 1, 64, 2, 2, 256);
  CHECK(c.path == AttentionPath::fused);

  // Grouped-query attention (4 query heads over 2 K/V heads, and multi-query over 1): the fused
  // graph reads the K/V heads in place and agrees with the fallback on q, k and v gradients.
  for (const int kv : {2, 1}) {
    c = be->choose_attention(AttentionRequest::auto_, DType::bf16, 2, 64, 4, kv, 32);
    CHECK(c.path == AttentionPath::fused);
    CHECK_THAT(c.reason, Contains("checked against the fallback on this shape") &&
                             Contains("NH=4 KV=" + std::to_string(kv) + " HS=32"));
  }
  // 3 K/V heads cannot serve 4 query heads (config validation refuses it first; cuDNN's
  // shape check says so too).
  c = be->choose_attention(AttentionRequest::auto_, DType::bf16, 1, 64, 4, 3, 32);
  CHECK(c.path == fallback);
  CHECK_THAT(c.reason, Contains("3 K/V heads do not divide 4 query heads"));
}

TEST_CASE("simulated device: a layer whose FP8 GEMMs cuBLASLt cannot run is left to the emulation, with the reason",
          "[sim]") {
  const auto be = make_cuda_backend(0, 512 * kMiB);
  using Scaling = Fp8Gemms::Scaling;
  constexpr auto kOwn = Fp8Gemms::WeightCodes::own;
  std::string why;
  CHECK(be->make_fp8_gemms(64, 40, 64, Scaling::tensor, Format::e4m3, Format::e5m2, -1, kOwn, &why) == nullptr);
  CHECK_THAT(why, Contains("this layer's shape does not suit cuBLASLt's FP8 GEMMs"));
  CHECK(be->make_fp8_gemms(128, 192, 128, Scaling::blocks, Format::e4m3, Format::e4m3, -1, kOwn, &why) == nullptr);
  CHECK_THAT(why, Contains("this layer's shape does not suit cuBLASLt's FP8 GEMMs"));
  CHECK(be->make_fp8_gemms(64, 64, 64, Scaling::tensor, Format::e5m2, Format::e5m2, -1, kOwn, &why) == nullptr);
  CHECK_THAT(why, Contains("e5m2"));

  const size_t before = be->memory_use().in_use;
  sim::fail_call("cublasLtMatmulAlgoGetHeuristic", 1, CUBLAS_STATUS_NOT_SUPPORTED);
  CHECK(be->make_fp8_gemms(64, 64, 64, Scaling::tensor, Format::e4m3, Format::e5m2, -1, kOwn, &why) == nullptr);
  CHECK_THAT(why, Contains("cuBLASLt on this GPU cannot run the forward GEMM: cuBLASLt has no algorithm"));
  CHECK(be->memory_use().in_use == before);  // the refused layer's buffers were given back

  // cuBLASLt refusing at launch what its heuristic offered: the layer's one launch of each GEMM
  // finds it, so training never meets it (the 1st launch is the forward GEMM's, the 3rd wgrad's).
  // Shapes not asked before: a refusal by the heuristic is remembered per shape.
  for (const auto& [nth, gemm, C] : {std::tuple{1, "forward", 128}, std::tuple{3, "wgrad", 160}}) {
    sim::fail_call("cublasLtMatmul", nth, CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK(be->make_fp8_gemms(64, C, 64, Scaling::tensor, Format::e4m3, Format::e5m2, -1, kOwn, &why) == nullptr);
    CHECK_THAT(why, Contains(std::string("cuBLASLt on this GPU cannot run the ") + gemm + " GEMM: cuBLASLt refused "
                                                                                          "to launch") &&
                        Contains("which its heuristic had offered (CUBLAS_STATUS_NOT_SUPPORTED)"));
    CHECK(be->memory_use().in_use == before);
    sim::clear_faults();
  }

  CHECK(be->make_fp8_gemms(64, 96, 64, Scaling::tensor, Format::e4m3, Format::e5m2, -1, kOwn, &why) != nullptr);
}

TEST_CASE("simulated device: cuDNN 9.15.0 and older keep a sequence length that is not a multiple of 128 off "
          "the fused attention",
          "[sim]") {
  // cudnn-frontend adds a padding mask to the backward there (an invalid memory access otherwise,
  // fixed in cuDNN 9.15.1); ptrain's graph has none, so the fallback runs such shapes.
  for (const auto& [version, T, fused] : {std::tuple{"91500", 64, false}, std::tuple{"91500", 128, true},
                                          std::tuple{"91501", 64, true}}) {
    CAPTURE(version, T);
    const SimulatedCudnnVersion cudnn(version);
    const auto be = make_cuda_backend(0, 512 * kMiB);
    const AttentionChoice c = be->choose_attention(AttentionRequest::auto_, DType::bf16, 1, T, 2, 2, 32);
    CHECK((c.path == AttentionPath::fused) == fused);
    if (!fused)
      CHECK_THAT(c.reason, Contains("cuDNN 9.15.0 can fault in the attention backward when the sequence length (64) "
                                    "is not a multiple of 128"));
  }
}

// ---------------------------------------------------------------------------- the simulated cuDNN

// Builds one operation graph through cuDNN's backend API, as a caller other than ptrain would,
// and asks for an execution plan: the simulated cuDNN's answer for graphs ptrain never builds
// (it refuses their shapes itself before asking).
class BackendGraph {
 public:
  BackendGraph() = default;
  BackendGraph(const BackendGraph&) = delete;
  BackendGraph& operator=(const BackendGraph&) = delete;
  ~BackendGraph() {
    for (auto it = owned_.rbegin(); it != owned_.rend(); ++it) cudnnBackendDestroyDescriptor(*it);
  }

  cudnnBackendDescriptor_t tensor(const std::vector<int64_t>& dims, const std::vector<int64_t>& strides,
                                  cudnnDataType_t type, bool is_virtual = false) {
    cudnnBackendDescriptor_t t = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    const int64_t uid = next_uid_++, alignment = 16;
    set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
    set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, int64_t(dims.size()), dims.data());
    set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, int64_t(strides.size()), strides.data());
    set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment);
    const bool yes = true;
    if (is_virtual) set(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &yes);
    finalize(t);
    return t;
  }
  // Row-major strides.
  cudnnBackendDescriptor_t packed(const std::vector<int64_t>& dims, cudnnDataType_t type, bool is_virtual = false) {
    std::vector<int64_t> strides(dims.size(), 1);
    for (size_t i = dims.size() - 1; i-- > 0;) strides[i] = strides[i + 1] * dims[i + 1];
    return tensor(dims, strides, type, is_virtual);
  }

  void matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c) {
    cudnnBackendDescriptor_t mm = make(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    set(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &kFloat);
    finalize(mm);
    cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    set(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a);
    set(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
    set(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c);
    set(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mm);
    add(op);
  }
  // y = x (unary modes) or x `mode` b.
  void pointwise(cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                 cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t pw = make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &kFloat);
    finalize(pw);
    cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw);
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    if (b) set(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    add(op);
  }
  void reduction(cudnnReduceTensorOp_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t red = make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    set(red, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode);
    set(red, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &kFloat);
    finalize(red);
    cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    set(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &red);
    set(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    set(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    add(op);
  }
  void reshape(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    set(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    set(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    add(op);
  }

  // The status of finalizing an execution plan for the graph (the heuristics' first engine) and,
  // when it is refused, cuDNN's last error string in *why. Everything before the plan must finalize.
  cudnnStatus_t plan(std::string* why) {
    cudnnHandle_t handle = nullptr;
    REQUIRE(cudnnCreate(&handle) == CUDNN_STATUS_SUCCESS);
    cudnnBackendDescriptor_t graph = make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    set(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
    set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, int64_t(ops_.size()), ops_.data());
    finalize(graph);
    cudnnBackendDescriptor_t heur = make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    set(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph);
    set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    finalize(heur);
    cudnnBackendDescriptor_t config = make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    int64_t count = 0;
    REQUIRE(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &count,
                                     &config) == CUDNN_STATUS_SUCCESS);
    REQUIRE(count == 1);
    cudnnBackendDescriptor_t plan = make(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    set(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
    set(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &config);
    const cudnnStatus_t status = cudnnBackendFinalize(plan);
    char text[512] = {0};
    cudnnGetLastErrorString(text, sizeof(text));
    *why = status == CUDNN_STATUS_SUCCESS ? "" : text;
    cudnnDestroy(handle);
    return status;
  }

 private:
  static constexpr cudnnDataType_t kFloat = CUDNN_DATA_FLOAT;

  cudnnBackendDescriptor_t make(cudnnBackendDescriptorType_t type) {
    cudnnBackendDescriptor_t d = nullptr;
    REQUIRE(cudnnBackendCreateDescriptor(type, &d) == CUDNN_STATUS_SUCCESS);
    owned_.push_back(d);
    return d;
  }
  static void set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
                  int64_t count, const void* values) {
    REQUIRE(cudnnBackendSetAttribute(d, name, type, count, values) == CUDNN_STATUS_SUCCESS);
  }
  static void finalize(cudnnBackendDescriptor_t d) { REQUIRE(cudnnBackendFinalize(d) == CUDNN_STATUS_SUCCESS); }
  void add(cudnnBackendDescriptor_t op) {
    finalize(op);
    ops_.push_back(op);
  }

  int64_t next_uid_ = 1;
  std::vector<cudnnBackendDescriptor_t> owned_, ops_;
};

// One attention problem, as the graphs below declare it: the usual shape unless a test changes one thing.
struct Attention {
  int64_t b = 1, h_q = 2, h_k = 2, h_v = 2, s_q = 16, s_kv = 16, d_qk = 64, d_v = 64;
  int64_t h_scores = 0;  // heads of S and O; 0: h_q
  cudnnDataType_t io = CUDNN_DATA_BFLOAT16, stats = CUDNN_DATA_FLOAT;
  bool q_head_dim_contiguous = true;  // false: Q's head dimension has stride s_q (a (b, h, d, s) buffer)
};

cudnnBackendDescriptor_t q_tensor(BackendGraph& g, const Attention& a) {
  const std::vector<int64_t> dims = {a.b, a.h_q, a.s_q, a.d_qk};
  if (a.q_head_dim_contiguous) return g.packed(dims, a.io);
  return g.tensor(dims, {a.h_q * a.s_q * a.d_qk, a.s_q * a.d_qk, 1, a.s_q}, a.io);
}
// (b, h, s, d) in memory, declared transposed as (b, h, d, s): K^T and V^T as the matmuls take them.
cudnnBackendDescriptor_t transposed(BackendGraph& g, int64_t b, int64_t h, int64_t s, int64_t d, cudnnDataType_t t) {
  return g.tensor({b, h, d, s}, {h * s * d, s * d, 1, d}, t);
}

// The forward pattern, reduced: S = Q K^T, P = exp(S), O = P V, Stats = rowmax(S).
cudnnStatus_t forward_plan(const Attention& a, std::string* why) {
  BackendGraph g;
  const int64_t h = a.h_scores ? a.h_scores : a.h_q;
  const auto q = q_tensor(g, a), k_t = transposed(g, a.b, a.h_k, a.s_kv, a.d_qk, a.io);
  const auto v = g.packed({a.b, a.h_v, a.s_kv, a.d_v}, a.io), o = g.packed({a.b, h, a.s_q, a.d_v}, a.io);
  const auto stats = g.packed({a.b, h, a.s_q, 1}, a.stats);
  const auto s = g.packed({a.b, h, a.s_q, a.s_kv}, CUDNN_DATA_FLOAT, true);
  const auto p = g.packed({a.b, h, a.s_q, a.s_kv}, CUDNN_DATA_FLOAT, true);
  g.matmul(q, k_t, s);
  g.pointwise(CUDNN_POINTWISE_EXP, s, nullptr, p);
  g.matmul(p, v, o);
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, s, stats);
  return g.plan(why);
}

// The backward pattern, reduced: P = exp(Q K^T - Stats), dP = dO V^T, dS = P (dP - rowsum(dO O)),
// dQ = dS K.
cudnnStatus_t backward_plan(const Attention& a, std::string* why) {
  BackendGraph g;
  const int64_t h = a.h_q;
  const auto q = q_tensor(g, a), k_t = transposed(g, a.b, a.h_k, a.s_kv, a.d_qk, a.io);
  const auto v_t = transposed(g, a.b, a.h_v, a.s_kv, a.d_v, a.io);
  const auto o = g.packed({a.b, h, a.s_q, a.d_v}, a.io), d_o = g.packed({a.b, h, a.s_q, a.d_v}, a.io);
  const auto stats = g.packed({a.b, h, a.s_q, 1}, a.stats), dq = g.packed({a.b, h, a.s_q, a.d_qk}, a.io);
  const auto scores = [&] { return g.packed({a.b, h, a.s_q, a.s_kv}, CUDNN_DATA_FLOAT, true); };
  const auto s = scores(), centered = scores(), p = scores(), dp = scores(), dp_centered = scores(), ds = scores();
  const auto do_o = g.packed({a.b, h, a.s_q, a.d_v}, CUDNN_DATA_FLOAT, true);
  const auto softmax_sum = g.packed({a.b, h, a.s_q, 1}, CUDNN_DATA_FLOAT, true);
  const auto k = g.packed({a.b, a.h_k, a.s_kv, a.d_qk}, CUDNN_DATA_FLOAT, true);
  g.matmul(q, k_t, s);
  g.pointwise(CUDNN_POINTWISE_SUB, s, stats, centered);
  g.pointwise(CUDNN_POINTWISE_EXP, centered, nullptr, p);
  g.matmul(d_o, v_t, dp);
  g.pointwise(CUDNN_POINTWISE_MUL, d_o, o, do_o);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, do_o, softmax_sum);
  g.pointwise(CUDNN_POINTWISE_SUB, dp, softmax_sum, dp_centered);
  g.pointwise(CUDNN_POINTWISE_MUL, dp_centered, p, ds);
  g.reshape(k_t, k);
  g.matmul(ds, k, dq);
  return g.plan(why);
}

TEST_CASE("simulated device: cuDNN refuses the attention graphs its fused flash-attention engines do not take",
          "[sim]") {
  std::string why;
  const Attention base;
  // Each variant differs from `base` in one thing; `base` itself is taken, both passes.
  REQUIRE(forward_plan(base, &why) == CUDNN_STATUS_SUCCESS);
  REQUIRE(backward_plan(base, &why) == CUDNN_STATUS_SUCCESS);
  const auto variant = [&](auto change) {
    Attention a = base;
    change(a);
    return a;
  };

  SECTION("Q, K, V, O and dO in FP16 or BF16, the statistics in FP32") {
    const Attention fp16 = variant([](Attention& a) { a.io = CUDNN_DATA_HALF; });
    CHECK(forward_plan(fp16, &why) == CUDNN_STATUS_SUCCESS);
    CHECK(backward_plan(fp16, &why) == CUDNN_STATUS_SUCCESS);
    const Attention fp32 = variant([](Attention& a) { a.io = CUDNN_DATA_FLOAT; });
    CHECK(forward_plan(fp32, &why) == CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE);
    CHECK_THAT(why, Contains("fused flash attention (forward): Q is FP32; the engines take FP16 or BF16"));
    CHECK(backward_plan(fp32, &why) == CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE);
    const Attention half_stats = variant([](Attention& a) { a.stats = CUDNN_DATA_HALF; });
    CHECK(forward_plan(half_stats, &why) == CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE);
    CHECK_THAT(why, Contains("Stats is FP16; the engines take FP32 statistics"));
    CHECK(backward_plan(half_stats, &why) == CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE);
    CHECK_THAT(why, Contains("fused flash attention (backward): Stats"));
  }
  SECTION("each head's elements contiguous") {
    const Attention strided = variant([](Attention& a) { a.q_head_dim_contiguous = false; });
    CHECK(forward_plan(strided, &why) == CUDNN_STATUS_NOT_SUPPORTED_LAYOUT);
    CHECK_THAT(why, Contains("Q's head dimension has stride 16, not 1"));
    CHECK(backward_plan(strided, &why) == CUDNN_STATUS_NOT_SUPPORTED_LAYOUT);
  }
  SECTION("K/V heads dividing the query heads") {
    // 2 query heads and 3 K/V heads, paired through 6 score heads (every matmul's batch extents
    // divide its output's, so only the attention rule can refuse it).
    const Attention gqa = variant([](Attention& a) {
      a.h_k = a.h_v = 3;
      a.h_scores = 6;
    });
    CHECK(forward_plan(gqa, &why) == CUDNN_STATUS_NOT_SUPPORTED_SHAPE);
    CHECK_THAT(why, Contains("K/V heads that do not divide the query heads"));
    CHECK(forward_plan(variant([](Attention& a) { a.h_k = a.h_v = 1; }), &why) == CUDNN_STATUS_SUCCESS);
  }
  SECTION("head dimensions: multiples of 8, equal (or 192 with 128), at most 256 on Hopper") {
    CHECK(forward_plan(variant([](Attention& a) { a.d_qk = a.d_v = 12; }), &why) == CUDNN_STATUS_NOT_SUPPORTED_SHAPE);
    CHECK_THAT(why, Contains("head dimensions must be multiples of 8"));
    CHECK(forward_plan(variant([](Attention& a) { a.d_v = 32; }), &why) == CUDNN_STATUS_NOT_SUPPORTED_SHAPE);
    CHECK_THAT(why, Contains("d_qk != d_v"));
    CHECK(forward_plan(variant([](Attention& a) { a.d_qk = 192;
      a.d_v = 128; }), &why) == CUDNN_STATUS_SUCCESS);
    for (const bool backward : {false, true}) {
      const auto plan = backward ? backward_plan : forward_plan;
      CHECK(plan(variant([](Attention& a) { a.d_qk = a.d_v = 256; }), &why) == CUDNN_STATUS_SUCCESS);
      CHECK(plan(variant([](Attention& a) { a.d_qk = a.d_v = 264; }), &why) == CUDNN_STATUS_NOT_SUPPORTED_SHAPE);
      CHECK_THAT(why, Contains("head dimension 264 above the 256"));
    }
  }
  SECTION("a backward needs more than one query and one key") {
    const Attention single = variant([](Attention& a) { a.s_q = a.s_kv = 1; });
    CHECK(forward_plan(single, &why) == CUDNN_STATUS_SUCCESS);
    CHECK(backward_plan(single, &why) == CUDNN_STATUS_NOT_SUPPORTED_SHAPE);
    CHECK_THAT(why, Contains("s_q = s_kv = 1 has no backward"));
    CHECK(backward_plan(variant([](Attention& a) { a.s_q = 1; }), &why) == CUDNN_STATUS_SUCCESS);
  }
  SECTION("sm80 or newer; before Hopper, a backward's head dimension at most 128") {
    {
      const SimulatedComputeCapability turing(7, 5);
      CHECK(forward_plan(base, &why) == CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH);
      CHECK_THAT(why, Contains("needs sm80 or newer, this GPU is sm75"));
    }
    const SimulatedComputeCapability ampere(8, 6);
    CHECK(forward_plan(base, &why) == CUDNN_STATUS_SUCCESS);
    const Attention wide = variant([](Attention& a) { a.d_qk = a.d_v = 136; });
    CHECK(forward_plan(wide, &why) == CUDNN_STATUS_SUCCESS);
    CHECK(backward_plan(wide, &why) == CUDNN_STATUS_NOT_SUPPORTED_SHAPE);
    CHECK_THAT(why, Contains("head dimension 136 above the 128 the backward pass takes on sm86"));
    CHECK(backward_plan(variant([](Attention& a) { a.d_qk = a.d_v = 128; }), &why) == CUDNN_STATUS_SUCCESS);
    const SimulatedComputeCapability hopper(9, 0);
    CHECK(backward_plan(wide, &why) == CUDNN_STATUS_SUCCESS);
  }
  SECTION("not cuDNN 9.10.0 or 9.10.1") {
    for (const auto& [version, taken] : {std::pair{"91000", false}, std::pair{"91001", false},
                                         std::pair{"91002", true}}) {
      CAPTURE(version);
      const SimulatedCudnnVersion cudnn(version);
      CHECK((forward_plan(base, &why) == CUDNN_STATUS_SUCCESS) == taken);
      CHECK((backward_plan(base, &why) == CUDNN_STATUS_SUCCESS) == taken);
      if (!taken) CHECK_THAT(why, Contains("has known bugs in FP16/BF16 attention"));
    }
  }
  SECTION("a graph that is not attention is not held to them") {
    // An FP32 matmul and its exponent: no second matmul, so no attention engine is needed.
    BackendGraph g;
    const auto a = g.packed({1, 2, 16, 12}, CUDNN_DATA_FLOAT), b = g.packed({1, 2, 12, 16}, CUDNN_DATA_FLOAT);
    const auto c = g.packed({1, 2, 16, 16}, CUDNN_DATA_FLOAT, true), e = g.packed({1, 2, 16, 16}, CUDNN_DATA_FLOAT);
    g.matmul(a, b, c);
    g.pointwise(CUDNN_POINTWISE_EXP, c, nullptr, e);
    CHECK(g.plan(&why) == CUDNN_STATUS_SUCCESS);
  }
}

}  // namespace
}  // namespace ptrain::test
