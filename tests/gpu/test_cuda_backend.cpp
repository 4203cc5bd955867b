// The CUDA backend against the CPU reference, op by op: the op table's cases (tests/op_table.h),
// then what the table cannot express (accumulation checked row by row, token uploads running
// ahead, staging between dtypes, FP8 casts and GEMMs, cuDNN attention, AdamW). Every op runs on
// both backends with the same inputs, drawn on the format's grid so that both hold identical
// numbers (the CPU as f32 values of that format, the GPU in its own storage: bf16, f16, or f32
// for fp32 and the FP8 formats); the results are compared with the format's tolerance
// (tests/tolerances.h) and the FP8 casts bit for bit. Shapes: odd sizes (1, 7, 19, 111, 769:
// ragged vectors, tails, unaligned rows) and a GPT-2 124M layer (B=2, T=64, C=768, NH=12).
// Outputs that an op writes (rather than adds into) are poisoned with NaN on the device first,
// so an element the GPU leaves unwritten fails. Skipped without a CUDA device (tests/gpu/main.cpp).
#include <catch2/catch.hpp>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iterator>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "core/error.h"
#include "core/rng.h"
#include "op_table.h"
#ifdef PTRAIN_SIM_DEVICE
#include "sim.h"
#endif
#include "precision/formats.h"
#include "precision/fp8_scaling.h"
#include "test_util.h"
#include "tolerances.h"

namespace ptrain::test {
namespace {

constexpr size_t kArenaBytes = size_t(8) << 30;     // far more than any test here needs
constexpr int kB = 2, kT = 64, kC = 768, kNH = 12;  // GPT-2 124M

Backend& cpu() {
  static const std::unique_ptr<Backend> backend = make_cpu_backend(1);
  return *backend;
}

// One CUDA backend per test process (ctest runs each test case in its own process).
Backend& gpu() {
  static const std::unique_ptr<Backend> backend = make_cuda_backend(0, kArenaBytes);
  return *backend;
}

const Format kFormats[] = {Format::fp32, Format::bf16, Format::fp16};
const int kSizes[] = {1, 7, 19, 111, 769};

// cuBLASLt and OpenBLAS sum a dot product in different orders.
Tolerance gemm_tolerance(Format f) { return f == Format::fp32 ? Tolerance{2e-5, 1e-4} : op_tolerance(f); }

DType storage(Format f) { return gpu().storage_for(f, DType::f32); }

// Uniform values in [-scale, scale] rounded to format f (keep scale below an FP8 format's max).
std::vector<float> on_grid(size_t n, uint64_t seed, float scale, Format f) {
  Rng rng(seed, 0x67726964);
  std::vector<float> v(n);
  for (auto& x : v) x = round_to_format((2.0f * rng.uniform() - 1.0f) * scale, f, false);
  return v;
}

// Magnitudes spread log-uniformly over [2^-24, 2^13), both signs, some zeros, on format f's
// grid: FP8 casts of these underflow, saturate and round in every binade.
std::vector<float> wide_on_grid(size_t n, uint64_t seed, Format f) {
  Rng rng(seed, 0x77696465);
  std::vector<float> v(n);
  for (auto& x : v) {
    const float magnitude = std::ldexp(1.0f + rng.uniform(), static_cast<int>(rng.below(37)) - 24);
    x = rng.below(16) == 0 ? 0.0f : round_to_format(rng.below(2) ? -magnitude : magnitude, f, false);
  }
  return v;
}

std::vector<int32_t> random_tokens(size_t n, int vocab, uint64_t seed) {
  Rng rng(seed, 0x746f6b);
  std::vector<int32_t> v(n);
  for (auto& t : v) t = static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab)));
  return v;
}

std::vector<float> zeros(size_t n) { return std::vector<float>(n, 0.0f); }

// A tensor held by both backends: `host` (f32 on the format's grid) is the CPU backend's, and
// device memory of `storage` dtype the CUDA backend's, uploaded from the same values.
class Twin {
 public:
  Twin(std::vector<int64_t> shape, Format format, std::vector<float> values, DType device_dtype)
      : host(std::move(values)), shape_(std::move(shape)), format_(format), dtype_(device_dtype) {
    if (static_cast<int64_t>(host.size()) != shape_numel(shape_))
      throw std::invalid_argument("Twin: values and shape differ");
    device_ = gpu().allocate(host.size() * dtype_size(dtype_));
    to_device();
  }
  // Stored as the CUDA backend stores `format`.
  Twin(std::vector<int64_t> shape, Format format, std::vector<float> values)
      : Twin(std::move(shape), format, std::move(values), storage(format)) {}
  ~Twin() { gpu().release(device_); }
  Twin(const Twin&) = delete;
  Twin& operator=(const Twin&) = delete;

  Tensor cpu_view() {
    Tensor t(host.data(), DType::f32, shape_);
    t.format = format_;
    return t;
  }
  Tensor device_view() const {
    Tensor t(device_, dtype_, shape_, Device::cuda);
    t.format = format_;
    return t;
  }
  std::vector<float> from_device() const {
    std::vector<float> v(host.size());
    gpu().download(v.data(), device_view());
    return v;
  }
  void to_device() { gpu().upload(device_view(), host.data()); }
  void poison_device() {
    const std::vector<float> nan(host.size(), NAN);
    gpu().upload(device_view(), nan.data());
  }

  std::vector<float> host;

 private:
  std::vector<int64_t> shape_;
  Format format_;
  DType dtype_;
  void* device_ = nullptr;
};

// Token ids on both backends; the device copy goes through upload_tokens.
class Tokens {
 public:
  Tokens(std::vector<int64_t> shape, std::vector<int32_t> values) : host(std::move(values)), shape_(std::move(shape)) {
    if (static_cast<int64_t>(host.size()) != shape_numel(shape_))
      throw std::invalid_argument("Tokens: values and shape differ");
    device_ = gpu().allocate(host.size() * sizeof(int32_t));
    gpu().upload_tokens(device_view(), host.data());
  }
  ~Tokens() { gpu().release(device_); }
  Tokens(const Tokens&) = delete;
  Tokens& operator=(const Tokens&) = delete;

  Tensor cpu_view() { return Tensor(host.data(), DType::i32, shape_); }
  Tensor device_view() const { return Tensor(device_, DType::i32, shape_, Device::cuda); }

  std::vector<int32_t> host;

 private:
  std::vector<int64_t> shape_;
  void* device_ = nullptr;
};

// The device result against the CPU's within `tol`, in aggregate and per element (tests/tolerances.h;
// NaN never passes).
void expect_close(const std::string& what, const Twin& t, const Tolerance& tol) {
  const std::vector<float> got = t.from_device();
  const double err = relative_error(got, t.host);
  const ElementMismatches bad = element_mismatches(got, t.host, tol);
  INFO(what << ": relative error " << err << " (tolerance " << tol.rel_l2 << "); " << bad.count << " of " << got.size()
            << " elements outside their bound" << (bad.count ? ", the worst " + bad.worst : std::string()));
  CHECK(err <= tol.rel_l2);
  CHECK(bad.count == 0);
}
// An op's own tolerance (FP8 outputs, FP32 statistics), held per element too.
void expect_close(const std::string& what, const Twin& t, double tol) { expect_close(what, t, Tolerance{tol, tol}); }

// The device result equals the CPU's bit for bit.
void expect_identical(const std::string& what, const Twin& t) {
  const std::vector<float> got = t.from_device();
  size_t mismatches = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &t.host[i], sizeof(float)) != 0 && mismatches++ == 0) first = i;
  INFO(what << ": " << mismatches << " of " << got.size() << " elements differ"
            << (mismatches ? ", first at " + std::to_string(first) + ": " + std::to_string(got[first]) + " vs " +
                                 std::to_string(t.host[first])
                           : std::string()));
  CHECK(mismatches == 0);
}

// What an accumulating op added to a (rows, C) table: the change of the rows it should touch
// against the CPU's change within tol (the change alone, so an error in a few rows cannot hide
// in a table of untouched ones), and every other row left as it was, bit for bit.
void expect_rows_added(const std::string& what, const Twin& t, const std::vector<float>& before,
                       const std::set<int64_t>& touched, int64_t C, double tol) {
  const std::vector<float> got = t.from_device();
  std::vector<float> got_change, want_change;
  size_t changed_elsewhere = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (touched.count(static_cast<int64_t>(i) / C)) {
      got_change.push_back(got[i] - before[i]);
      want_change.push_back(t.host[i] - before[i]);
    } else if (std::memcmp(&got[i], &before[i], sizeof(float)) != 0) {
      ++changed_elsewhere;
    }
  }
  const double err = relative_error(got_change, want_change);
  INFO(what << ": " << touched.size() << " rows touched, relative error of their change " << err << " (tolerance "
            << tol << "); " << changed_elsewhere << " elements of other rows changed");
  CHECK(err <= tol);
  CHECK(changed_elsewhere == 0);
}

void expect_same_stats(const Fp8CastStats& got, const Fp8CastStats& want) {
  CHECK(std::memcmp(&got.amax, &want.amax, sizeof(float)) == 0);
  CHECK(got.nonzero == want.nonzero);
  CHECK(got.underflow == want.underflow);
  CHECK(got.saturated == want.saturated);
}

// ---------------------------------------------------------------------------- identity, memory

TEST_CASE("gpu: the backend names itself and maps formats to storage", "[gpu]") {
  Backend& g = gpu();
  CHECK(g.name() == "cuda");
  CHECK(g.device() == Device::cuda);
  INFO(g.description());
  CHECK(g.description().find("sm_") != std::string::npos);
  CHECK(g.description().find("cuBLASLt") != std::string::npos);
  for (const std::string& warning : g.performance_warnings()) WARN(warning);
  CHECK(g.storage_for(Format::fp32, DType::f32) == DType::f32);
  CHECK(g.storage_for(Format::bf16, DType::f32) == DType::bf16);
  CHECK(g.storage_for(Format::fp16, DType::f32) == DType::f16);
  CHECK(g.storage_for(Format::e4m3, DType::f32) == DType::f32);
  CHECK(g.storage_for(Format::e5m2, DType::f32) == DType::f32);
  CHECK_THROWS_AS(g.storage_for(Format::fp32, DType::f64), std::logic_error);  // a bug, not bad input
  void* p = g.allocate(64);
  const Tensor f64(p, DType::f64, {4}, Device::cuda);
  CHECK_THROWS_WITH(g.gelu_forward(f64, f64), Catch::Contains("f64"));
  g.release(p);
  const GradNumerics numerics = g.take_grad_numerics();  // not counted on the GPU yet
  CHECK(numerics.elements == 0);
}

TEST_CASE("gpu: the backend's stream is non-blocking: legacy-stream work cannot break a graph capture", "[gpu]") {
  // Work that a library queues on the legacy default stream would wait for a blocking stream, and
  // during a capture that dependency invalidates it (the simulated device enforces this).
  unsigned int flags = 0;
  REQUIRE(cudaStreamGetFlags(static_cast<cudaStream_t>(gpu().stream()), &flags) == cudaSuccess);
  CHECK(flags == cudaStreamNonBlocking);
}

TEST_CASE("gpu: allocate hands out zeroed aligned blocks and release takes them back in any order", "[gpu]") {
  Backend& g = gpu();
  const Backend::MemoryUse before = g.memory_use();
  CHECK(before.capacity == kArenaBytes);
  std::vector<void*> blocks;
  for (const size_t bytes : {size_t(1), size_t(100), size_t(4096), size_t(1) << 20, size_t(3)}) {
    void* p = g.allocate(bytes);
    CHECK(reinterpret_cast<uintptr_t>(p) % 256 == 0);
    blocks.push_back(p);
  }
  CHECK(g.memory_use().in_use >= before.in_use + (size_t(1) << 20) + 4096);
  // Dirty a block, give it back and take one of its size again: it comes back zeroed.
  const std::vector<float> ones(1024, 1.0f);
  g.upload(Tensor(blocks[2], DType::f32, {1024}, Device::cuda), ones.data());
  g.release(blocks[2]);
  blocks[2] = g.allocate(4096);
  std::vector<float> got(1024, 1.0f);
  g.download(got.data(), Tensor(blocks[2], DType::f32, {1024}, Device::cuda));
  CHECK(got == zeros(1024));
  for (const int i : {1, 3, 0, 4, 2}) g.release(blocks[i]);
  const Backend::MemoryUse after = g.memory_use();
  CHECK(after.in_use == before.in_use);
  CHECK(after.peak >= before.in_use + (size_t(1) << 20));
  CHECK_THROWS_AS(g.allocate(size_t(1) << 40), EnvironmentError);
  CHECK_THROWS_WITH(g.allocate(size_t(1) << 40), Catch::Contains("1099511627776 bytes"));
  CHECK_THROWS_AS(g.release(reinterpret_cast<void*>(uintptr_t(16))), std::logic_error);
}

TEST_CASE("gpu: upload download and zero keep every value of each storage grid", "[gpu]") {
  for (const Format f : kFormats)
    for (const int n : kSizes) {
      INFO(format_name(f) << " n=" << n);
      Twin t({n}, f, on_grid(size_t(n), 1, 3.0f, f));
      CHECK(t.from_device() == t.host);
      gpu().zero(t.device_view());
      CHECK(t.from_device() == zeros(size_t(n)));
    }
}

TEST_CASE("gpu: copy converts between dtypes and rounds to the destination format", "[gpu]") {
  const Format kDestinations[] = {Format::fp32, Format::bf16, Format::fp16, Format::e4m3, Format::e5m2};
  for (const Format src_format : kFormats)
    for (const Format dst_format : kDestinations)
      for (const bool f32_storage : {false, true}) {
        INFO(format_name(src_format) << " -> " << format_name(dst_format) << (f32_storage ? " in f32 storage" : ""));
        const int n = 769;
        Twin src({n}, src_format, on_grid(size_t(n), 2, 10.0f, src_format));
        Twin dst({n}, dst_format, zeros(size_t(n)), f32_storage ? DType::f32 : storage(dst_format));
        dst.poison_device();
        cpu().copy(dst.cpu_view(), src.cpu_view());
        gpu().copy(dst.device_view(), src.device_view());
        expect_identical("copy", dst);
      }
}

// ---------------------------------------------------------------------------- the op table

// The SIMT emulator's thread orders the cases run under: on the simulated device the kernels
// execute on the test's thread under the emulator, so every order of tests/kernels applies; a GPU
// has its own order. The body learns whether this is the first order.
void each_thread_order(const std::function<void(bool first)>& body) {
#ifdef PTRAIN_SIM_DEVICE
  bool first = true;
  for (const simt::Options& order : simt::test_orders()) {
    const simt::ScopedOptions use(order);
    INFO("SIMT thread order " << order.name());
    body(first);
    first = false;
  }
#else
  body(true);
#endif
}

// Cases above this many elements (the GPT-2-sized shapes) run under the first thread order only:
// an order's risks (a race, a tail, a block boundary) live in the small and odd shapes, which run
// under every order, while a GPT-2-sized case costs seconds per order on the emulator.
constexpr int64_t kEveryOrderElements = 100000;

int64_t case_elements(const OpCase& c) {
  int64_t total = 0;
  for (const OpOperand& o : c.operands) {
    int64_t n = 1;
    for (int64_t d : o.shape) n *= d;
    total += n;
  }
  return total;
}

// Each case of tests/op_table.h on the CPU backend (the reference) and this one, from the same
// inputs; every result within its tolerance, in aggregate and per element.
void check_op_family(const std::string& family) {
  const std::vector<OpCase> cases = op_cases(family);
  each_thread_order([&](bool first) {
    for (const OpCase& c : cases) {
      if (!first && case_elements(c) > kEveryOrderElements) continue;
      for (const OperandResult& r : run_op_case(c, cpu(), gpu())) {
        const Tolerance tol = check_tolerance(*r.operand);
        const double err = relative_error(r.tested, r.reference);
        const ElementMismatches bad = element_mismatches(r.tested, r.reference, tol);
        INFO(c.label << ", " << r.operand->name << ": relative error " << err << " (tolerance " << tol.rel_l2 << "); "
                     << bad.count << " of " << r.tested.size() << " elements outside their bound"
                     << (bad.count ? ", the worst " + bad.worst : std::string()));
        CHECK(err <= tol.rel_l2);
        CHECK(bad.count == 0);
      }
    }
  });
}

// The families each have a test case below (ctest runs them apart, in parallel).
const char* const kFamiliesTestedHere[] = {"embedding", "classifier", "layernorm", "rmsnorm", "qk_norm", "rope",
                                           "swiglu",    "gelu",       "add",       "matmul",  "attention"};

TEST_CASE("gpu: every family of the op table has a test case of this file", "[gpu]") {
  const std::vector<std::string> here(std::begin(kFamiliesTestedHere), std::end(kFamiliesTestedHere));
  CHECK(here == op_families());
}

#define OP_FAMILY_TEST(family)                                                                   \
  TEST_CASE("gpu: the op table's " family " cases match the CPU backend", "[gpu][op-table]") { \
    check_op_family(family);                                                                     \
  }
OP_FAMILY_TEST("embedding")
OP_FAMILY_TEST("classifier")
OP_FAMILY_TEST("layernorm")
OP_FAMILY_TEST("rmsnorm")
OP_FAMILY_TEST("qk_norm")
OP_FAMILY_TEST("rope")
OP_FAMILY_TEST("swiglu")
OP_FAMILY_TEST("gelu")
OP_FAMILY_TEST("add")
OP_FAMILY_TEST("matmul")
OP_FAMILY_TEST("attention")

// ---------------------------------------------------------------------------- embedding

struct EmbeddingShape {
  int B, T, C, V;
};
const EmbeddingShape kEmbeddingShapes[] = {{1, 1, 1, 1},      {2, 7, 7, 3},     {1, 19, 19, 111},
                                           {3, 111, 111, 19}, {1, 7, 769, 769}, {kB, kT, kC, 50304}};

// embedding_forward is in the op table; the backward adds into the rows its tokens and positions
// name, checked row by row.
TEST_CASE("gpu: embedding_backward adds into the rows of its tokens and positions as the CPU backend does", "[gpu]") {
  for (const Format f : kFormats)
    for (const EmbeddingShape& s : kEmbeddingShapes) {
      INFO(format_name(f) << " B=" << s.B << " T=" << s.T << " C=" << s.C << " V=" << s.V);
      const size_t bt = size_t(s.B) * s.T, rows = size_t(s.T) + 3;  // wpe has more rows than T, as the model's
      Tokens tokens({s.B, s.T}, random_tokens(bt, s.V, 1));
      Twin dout({s.B, s.T, s.C}, f, on_grid(bt * s.C, 4, 1.0f, f));
      Twin dwte({s.V, s.C}, f, on_grid(size_t(s.V) * s.C, 5, 0.5f, f));
      Twin dwpe({s.T + 3, s.C}, f, on_grid(rows * s.C, 6, 0.5f, f));
      const std::vector<float> dwte_before = dwte.host, dwpe_before = dwpe.host;
      cpu().embedding_backward(dwte.cpu_view(), dwpe.cpu_view(), dout.cpu_view(), tokens.cpu_view());
      gpu().embedding_backward(dwte.device_view(), dwpe.device_view(), dout.device_view(), tokens.device_view());
      const std::set<int64_t> token_rows(tokens.host.begin(), tokens.host.end());
      std::set<int64_t> position_rows;
      for (int64_t t = 0; t < s.T; ++t) position_rows.insert(t);
      expect_rows_added("embedding_backward dwte", dwte, dwte_before, token_rows, s.C, tolerance(f));
      expect_rows_added("embedding_backward dwpe", dwpe, dwpe_before, position_rows, s.C, tolerance(f));
    }
}

TEST_CASE("gpu: embedding_backward follows re-uploaded tokens and views of them", "[gpu]") {
  const int B = 2, T = 19, C = 7, V = 11;
  const Format f = Format::fp32;
  Tokens tokens({B, T}, random_tokens(size_t(B) * T, V, 91));
  Twin dout({B, T, C}, f, on_grid(size_t(B) * T * C, 92, 1.0f, f));
  Twin dwte({V, C}, f, zeros(size_t(V) * C)), dwpe({T, C}, f, zeros(size_t(T) * C));
  // New tokens in the same tensor: the backward must bucket these, not the first ones.
  tokens.host = random_tokens(size_t(B) * T, V, 93);
  gpu().upload_tokens(tokens.device_view(), tokens.host.data());
  cpu().embedding_backward(dwte.cpu_view(), dwpe.cpu_view(), dout.cpu_view(), tokens.cpu_view());
  gpu().embedding_backward(dwte.device_view(), dwpe.device_view(), dout.device_view(), tokens.device_view());
  expect_close("dwte after re-upload", dwte, op_tolerance(f));
  expect_close("dwpe after re-upload", dwpe, op_tolerance(f));
  // The first sequence only: same data pointer, fewer tokens, bucketed from device memory.
  Twin dout_first({1, T, C}, f, on_grid(size_t(T) * C, 94, 1.0f, f));
  const Tensor cpu_first = tokens.cpu_view().range(0, T).reshaped({1, T});
  const Tensor gpu_first = tokens.device_view().range(0, T).reshaped({1, T});
  cpu().embedding_backward(dwte.cpu_view(), dwpe.cpu_view(), dout_first.cpu_view(), cpu_first);
  gpu().embedding_backward(dwte.device_view(), dwpe.device_view(), dout_first.device_view(), gpu_first);
  expect_close("dwte from a view", dwte, op_tolerance(f));
  expect_close("dwpe from a view", dwpe, op_tolerance(f));
}

// Uploads that run ahead of the device: three batches of tokens go up through the pinned
// staging buffers (two, used in turn) with nothing synchronised between them, each followed by
// a backward into its own table. A staging buffer refilled before its copy ran would hand an
// earlier backward a later batch's tokens (the simulated device runs copies late, so it would).
TEST_CASE("gpu: embedding_backward uses each upload's own tokens when uploads run ahead of the device", "[gpu]") {
  const int B = 2, T = 19, C = 7, V = 11, rounds = 3;
  const Format f = Format::fp32;
  Tokens tokens({B, T}, random_tokens(size_t(B) * T, V, 101));
  Twin dout({B, T, C}, f, on_grid(size_t(B) * T * C, 102, 1.0f, f));
  std::vector<std::unique_ptr<Twin>> dwte, dwpe;
  for (int r = 0; r < rounds; ++r) {
    dwte.push_back(std::make_unique<Twin>(std::vector<int64_t>{V, C}, f, zeros(size_t(V) * C)));
    dwpe.push_back(std::make_unique<Twin>(std::vector<int64_t>{T, C}, f, zeros(size_t(T) * C)));
  }
  for (int r = 0; r < rounds; ++r) {
    tokens.host = random_tokens(size_t(B) * T, V, 103 + r);
    gpu().upload_tokens(tokens.device_view(), tokens.host.data());
    cpu().embedding_backward(dwte[r]->cpu_view(), dwpe[r]->cpu_view(), dout.cpu_view(), tokens.cpu_view());
    gpu().embedding_backward(dwte[r]->device_view(), dwpe[r]->device_view(), dout.device_view(), tokens.device_view());
  }
  for (int r = 0; r < rounds; ++r) {
    INFO("upload " << r + 1 << " of " << rounds);
    expect_close("dwte", *dwte[r], op_tolerance(f));
  }
}

// ---------------------------------------------------------------------------- matmul

struct MatmulShape {
  int N, C, OC;
};
// One row (decoding's single position) and one element: shapes cuBLASLt refuses a BIAS epilogue for.
const MatmulShape kMatmulShapes[] = {{1, 1, 1},       {1, 111, 769},   {7, 7, 19},          {19, 111, 7},
                                     {111, 19, 769}, {769, 769, 111}, {kB * kT, kC, 3 * kC}};

// The FP8 path of the model: f32 tensors holding dequantised e4m3 / e5m2 values as operands,
// bf16 outputs and gradients (cuBLASLt has no f32 x f32 -> bf16 GEMM: FP32 scratch, then one
// rounding), and f32 storage of a bf16 output (rounded after the op).
TEST_CASE("gpu: matmul with f32 FP8 operands and bf16 outputs matches the CPU backend", "[gpu]") {
  const Format bf16 = Format::bf16;
  for (const MatmulShape& s : kMatmulShapes) {
    INFO("N=" << s.N << " C=" << s.C << " OC=" << s.OC);
    const size_t nc = size_t(s.N) * s.C, noc = size_t(s.N) * s.OC, occ = size_t(s.OC) * s.C;
    Twin inp({s.N, s.C}, Format::e4m3, on_grid(nc, 41, 4.0f, Format::e4m3), DType::f32);
    Twin weight({s.OC, s.C}, Format::e4m3, on_grid(occ, 42, 2.0f, Format::e4m3), DType::f32);
    Twin dout({s.N, s.OC}, Format::e5m2, on_grid(noc, 43, 1.0f, Format::e5m2), DType::f32);
    Twin bias({s.OC}, bf16, on_grid(size_t(s.OC), 44, 1.0f, bf16));
    Twin out({s.N, s.OC}, bf16, zeros(noc));
    Twin out_f32({s.N, s.OC}, bf16, zeros(noc), DType::f32);
    out.poison_device();
    out_f32.poison_device();
    for (Twin* o : {&out, &out_f32}) {
      cpu().matmul_forward(o->cpu_view(), inp.cpu_view(), weight.cpu_view(), bias.cpu_view());
      gpu().matmul_forward(o->device_view(), inp.device_view(), weight.device_view(), bias.device_view());
    }
    expect_close("matmul_forward bf16 out", out, op_tolerance(bf16));
    expect_close("matmul_forward bf16 values in f32 storage", out_f32, op_tolerance(bf16));

    Twin dinp({s.N, s.C}, bf16, on_grid(nc, 45, 0.5f, bf16)), dweight({s.OC, s.C}, bf16, on_grid(occ, 46, 0.5f, bf16));
    Twin dbias({s.OC}, bf16, on_grid(size_t(s.OC), 47, 0.5f, bf16));
    cpu().matmul_backward(dinp.cpu_view(), dweight.cpu_view(), dbias.cpu_view(), dout.cpu_view(), inp.cpu_view(),
                          weight.cpu_view());
    gpu().matmul_backward(dinp.device_view(), dweight.device_view(), dbias.device_view(), dout.device_view(),
                          inp.device_view(), weight.device_view());
    expect_close("matmul_backward bf16 dinp", dinp, op_tolerance(bf16));
    expect_close("matmul_backward bf16 dweight", dweight, op_tolerance(bf16));
    expect_close("matmul_backward bf16 dbias", dbias, op_tolerance(bf16));
  }
}

// ---------------------------------------------------------------------------- attention

struct AttentionShape {
  int B, T, NH, HS;
  int KV = 0;  // K/V heads (grouped-query attention); 0 = NH
  int width() const { return (NH + 2 * (KV > 0 ? KV : NH)) * HS; }  // of a qkv row
};
// cuDNN's flash attention (the fused path) against the CPU's reference attention: it must be
// offered for these shapes on a Hopper GPU (model.attention: cudnn), grouped K/V heads included
// (4:1, multi-query, and 12 over 3 at the GPT-2 width), give the CPU's output, and add the CPU's
// gradients into dqkv.
TEST_CASE("gpu: fused (cuDNN) attention matches the CPU backend", "[gpu]") {
  const AttentionShape shapes[] = {{1, 64, 1, 64},    {2, 128, 4, 32},        {3, 200, 2, 128},
                                   {kB, kT, kNH, kC / kNH}, {1, 1024, 12, 64}, {2, 128, 4, 32, 1},
                                   {2, 200, 8, 64, 2}, {1, 512, 12, 64, 3}};
  for (const Format f : {Format::bf16, Format::fp16})
    for (const AttentionShape& s : shapes) {
      const int KV = s.KV > 0 ? s.KV : s.NH;
      INFO(format_name(f) << " B=" << s.B << " T=" << s.T << " NH=" << s.NH << " KV=" << KV << " HS=" << s.HS);
      const AttentionChoice choice = gpu().choose_attention(AttentionRequest::cudnn, storage(f), s.B, s.T, s.NH, KV, s.HS);
      REQUIRE(choice.path == AttentionPath::fused);
      const int C = s.NH * s.HS, W = s.width();
      const size_t n = size_t(s.B) * s.T * C, n_att = size_t(s.B) * s.NH * s.T * s.T, n_qkv = size_t(s.B) * s.T * W;
      Twin qkv({s.B, s.T, W}, f, on_grid(n_qkv, 61, 1.0f, f));
      Twin out({s.B, s.T, C}, f, zeros(n)), probs({s.B, s.NH, s.T, s.T}, f, zeros(n_att));
      Twin lse({s.B, s.NH, s.T}, Format::fp32, zeros(size_t(s.B) * s.NH * s.T));
      out.poison_device();
      lse.poison_device();
      cpu().attention_forward(out.cpu_view(), probs.cpu_view(), qkv.cpu_view(), s.NH);
      gpu().attention_forward(out.device_view(), lse.device_view(), qkv.device_view(), s.NH);
      expect_close("fused attention out", out, gemm_tolerance(f));
      // Each saved log-sum-exp is finite.
      for (const float x : lse.from_device()) REQUIRE(std::isfinite(x));

      Twin dout({s.B, s.T, C}, f, on_grid(n, 62, 1.0f, f)), dqkv({s.B, s.T, W}, f, on_grid(n_qkv, 63, 0.5f, f));
      cpu().attention_backward(dqkv.cpu_view(), dout.cpu_view(), qkv.cpu_view(), out.cpu_view(), probs.cpu_view(), s.NH);
      out.to_device();  // both backwards from the CPU's output
      gpu().attention_backward(dqkv.device_view(), dout.device_view(), qkv.device_view(), out.device_view(),
                               lse.device_view(), s.NH);
      expect_close("fused attention dqkv", dqkv, gemm_tolerance(f));
    }
}

// ---------------------------------------------------------------------------- fused epilogues, staging

// The MLP's GELU in the GEMM epilogues against the CPU's separate ops. Each value is rounded
// once instead of twice. On the GPT-2 shape in bf16 and fp16 the fused path must run: the
// scratch it never touches stays NaN. FP32 keeps the separate ops (and the CPU's numbers).
TEST_CASE("gpu: matmul_gelu_forward and matmul_gelu_backward match the CPU's separate ops", "[gpu]") {
  struct Mlp {
    int N, C, H;  // tokens, width, hidden width (fc: C -> H, fc proj: H -> C)
    bool fused;   // aux leading dimensions multiples of 8: cuBLASLt takes the epilogue
  };
  const Mlp kShapes[] = {{7, 19, 111, false}, {kB * kT, kC, 4 * kC, true}};
  for (const Format f : kFormats)
    for (const Mlp& s : kShapes)
      for (const bool with_bias : {false, true}) {
        INFO(format_name(f) << " N=" << s.N << " C=" << s.C << " H=" << s.H << (with_bias ? " bias" : " no bias"));
        const Tolerance tol = gemm_tolerance(f);
        const size_t nc = size_t(s.N) * s.C, nh = size_t(s.N) * s.H, hc = size_t(s.H) * s.C;
        Twin inp({s.N, s.C}, f, on_grid(nc, 71, 1.0f, f)), fc_w({s.H, s.C}, f, on_grid(hc, 72, 0.1f, f));
        Twin fc_b({s.H}, f, on_grid(size_t(s.H), 73, 1.0f, f));
        Twin pre({s.N, s.H}, f, zeros(nh)), out({s.N, s.H}, f, zeros(nh));
        pre.poison_device();
        out.poison_device();
        const Tensor cpu_bias = with_bias ? fc_b.cpu_view() : Tensor(), gpu_bias = with_bias ? fc_b.device_view() : Tensor();
        cpu().matmul_gelu_forward(out.cpu_view(), pre.cpu_view(), inp.cpu_view(), fc_w.cpu_view(), cpu_bias);
        gpu().matmul_gelu_forward(out.device_view(), pre.device_view(), inp.device_view(), fc_w.device_view(), gpu_bias);
        expect_close("matmul_gelu_forward pre", pre, gemm_tolerance(f));
        expect_close("matmul_gelu_forward out", out, tol);

        // fc proj (C, H) after the GELU: dpre is written, dweight and dbias add.
        Twin dout({s.N, s.C}, f, on_grid(nc, 74, 1.0f, f)), proj_w({s.C, s.H}, f, on_grid(hc, 75, 0.1f, f));
        Twin dpre({s.N, s.H}, f, zeros(nh)), dgelu({s.N, s.H}, f, zeros(nh));
        Twin dweight({s.C, s.H}, f, on_grid(hc, 76, 0.5f, f)), dbias({s.C}, f, on_grid(size_t(s.C), 77, 0.5f, f));
        out.to_device();  // the CPU's GELU output and pre-activation on both sides
        pre.to_device();
        dpre.poison_device();
        dgelu.poison_device();
        cpu().matmul_gelu_backward(dpre.cpu_view(), dweight.cpu_view(), dbias.cpu_view(), dout.cpu_view(), out.cpu_view(),
                                   proj_w.cpu_view(), pre.cpu_view(), dgelu.cpu_view());
        gpu().matmul_gelu_backward(dpre.device_view(), dweight.device_view(), dbias.device_view(), dout.device_view(),
                                   out.device_view(), proj_w.device_view(), pre.device_view(), dgelu.device_view());
        expect_close("matmul_gelu_backward dpre", dpre, tol);
        expect_close("matmul_gelu_backward dweight", dweight, gemm_tolerance(f));
        expect_close("matmul_gelu_backward dbias", dbias, op_tolerance(f));
        const std::vector<float> scratch = dgelu.from_device();
        CHECK(std::all_of(scratch.begin(), scratch.end(), [](float x) { return std::isnan(x); }) ==
              (s.fused && f != Format::fp32));
      }
}

// Operands of another dtype than the op computes in are converted first; outputs stored wider
// than their format are rounded to it, bit for bit as the CPU rounds.
TEST_CASE("gpu: ops stage operands of other dtypes and round outputs stored wider than their format", "[gpu]") {
  const Format bf16 = Format::bf16, fp16 = Format::fp16;
  for (const int n : kSizes) {
    INFO("n=" << n);
    const size_t count = size_t(n);
    // add: bf16 + (bf16 values in f32 storage) -> bf16 values in f32 storage.
    Twin a({n}, bf16, on_grid(count, 71, 2.0f, bf16)), b({n}, bf16, on_grid(count, 72, 2.0f, bf16), DType::f32);
    Twin sum({n}, bf16, zeros(count), DType::f32);
    sum.poison_device();
    cpu().add(sum.cpu_view(), a.cpu_view(), b.cpu_view());
    gpu().add(sum.device_view(), a.device_view(), b.device_view());
    expect_identical("add into f32 storage of bf16", sum);
    // gelu of f32 into fp16 values held in f32 storage, and its backward into an f16 gradient.
    Twin x({n}, Format::fp32, on_grid(count, 73, 3.0f, Format::fp32));
    Twin y({n}, fp16, zeros(count), DType::f32), dx({n}, fp16, on_grid(count, 74, 0.5f, fp16));
    Twin dy({n}, Format::fp32, on_grid(count, 75, 1.0f, Format::fp32));
    y.poison_device();
    cpu().gelu_forward(y.cpu_view(), x.cpu_view());
    gpu().gelu_forward(y.device_view(), x.device_view());
    expect_close("gelu into f32 storage of fp16", y, op_tolerance(fp16));
    cpu().gelu_backward(dx.cpu_view(), x.cpu_view(), dy.cpu_view());
    gpu().gelu_backward(dx.device_view(), x.device_view(), dy.device_view());
    expect_close("gelu_backward into f16", dx, op_tolerance(fp16));
    // layernorm of bf16 rows with f32 weight and bias (on the bf16 grid).
    Twin inp({2, n}, bf16, on_grid(2 * count, 76, 2.0f, bf16)), out({2, n}, bf16, zeros(2 * count));
    Twin w({n}, bf16, on_grid(count, 77, 1.0f, bf16), DType::f32),
        bias({n}, bf16, on_grid(count, 78, 1.0f, bf16), DType::f32);
    Twin mean({2}, Format::fp32, zeros(2)), rstd({2}, Format::fp32, zeros(2));
    out.poison_device();
    cpu().layernorm_forward(out.cpu_view(), mean.cpu_view(), rstd.cpu_view(), inp.cpu_view(), w.cpu_view(),
                            bias.cpu_view());
    gpu().layernorm_forward(out.device_view(), mean.device_view(), rstd.device_view(), inp.device_view(),
                            w.device_view(), bias.device_view());
    expect_close("layernorm with f32 weights", out, op_tolerance(bf16));
  }
}

// The model's weight gradients are FP32 (the main gradients) beside bf16 or fp16 activations:
// every backward op adds into them as they are, with no staged copy rounded to the activations'
// type, from gradients that already hold a sum (a later micro-batch). Widths off the 16-byte
// chunk and rows of odd length take the kernels' partial-chunk paths.
TEST_CASE("gpu: backward ops add into FP32 weight gradients beside 16-bit activations as the CPU backend does",
          "[gpu]") {
  const Format fp32 = Format::fp32;
  const Tolerance sums = op_tolerance(fp32);
  for (const Format f : {Format::bf16, Format::fp16})
    for (const int n : kSizes) {
      INFO(format_name(f) << " C=" << n);
      const int rows = 37;
      const size_t c = size_t(n), rc = size_t(rows) * c;
      Twin inp({rows, n}, f, on_grid(rc, 81, 2.0f, f)), dout({rows, n}, f, on_grid(rc, 82, 1.0f, f));
      Twin w({n}, f, on_grid(c, 83, 1.0f, f)), b({n}, f, on_grid(c, 84, 1.0f, f));
      Twin out({rows, n}, f, zeros(rc)), mean({rows}, fp32, zeros(rows)), rstd({rows}, fp32, zeros(rows));
      Twin dinp({rows, n}, f, zeros(rc));
      Twin dw({n}, fp32, on_grid(c, 85, 0.5f, fp32), DType::f32), db({n}, fp32, on_grid(c, 86, 0.5f, fp32), DType::f32);
      cpu().layernorm_forward(out.cpu_view(), mean.cpu_view(), rstd.cpu_view(), inp.cpu_view(), w.cpu_view(),
                              b.cpu_view());
      gpu().layernorm_forward(out.device_view(), mean.device_view(), rstd.device_view(), inp.device_view(),
                              w.device_view(), b.device_view());
      cpu().layernorm_backward(dinp.cpu_view(), dw.cpu_view(), db.cpu_view(), dout.cpu_view(), inp.cpu_view(),
                               w.cpu_view(), mean.cpu_view(), rstd.cpu_view());
      gpu().layernorm_backward(dinp.device_view(), dw.device_view(), db.device_view(), dout.device_view(),
                               inp.device_view(), w.device_view(), mean.device_view(), rstd.device_view());
      expect_close("layernorm_backward dweight (f32)", dw, sums);
      expect_close("layernorm_backward dbias (f32)", db, sums);
      // RMSNorm's weight gradient.
      Twin rms({rows}, fp32, zeros(rows)), rdinp({rows, n}, f, zeros(rc));
      Twin rdw({n}, fp32, on_grid(c, 87, 0.5f, fp32), DType::f32);
      cpu().rmsnorm_forward(out.cpu_view(), rms.cpu_view(), inp.cpu_view(), w.cpu_view(), 1e-5f);
      gpu().rmsnorm_forward(out.device_view(), rms.device_view(), inp.device_view(), w.device_view(), 1e-5f);
      cpu().rmsnorm_backward(rdinp.cpu_view(), rdw.cpu_view(), dout.cpu_view(), inp.cpu_view(), w.cpu_view(),
                             rms.cpu_view());
      gpu().rmsnorm_backward(rdinp.device_view(), rdw.device_view(), dout.device_view(), inp.device_view(),
                             w.device_view(), rms.device_view());
      expect_close("rmsnorm_backward dweight (f32)", rdw, sums);
      // A bias gradient, and a linear layer's weight and bias gradients (FP32 C/D, beta 1).
      Twin dbias({n}, fp32, on_grid(c, 88, 0.5f, fp32), DType::f32);
      cpu().bias_backward(dbias.cpu_view(), dout.cpu_view());
      gpu().bias_backward(dbias.device_view(), dout.device_view());
      expect_close("bias_backward (f32)", dbias, sums);
      Twin weight({5, n}, f, on_grid(5 * c, 89, 1.0f, f)), lin_out({rows, 5}, f, on_grid(size_t(rows) * 5, 90, 1.0f, f));
      Twin dweight({5, n}, fp32, on_grid(5 * c, 91, 0.5f, fp32), DType::f32);
      Twin dlin_bias({5}, fp32, on_grid(5, 92, 0.5f, fp32), DType::f32);
      cpu().matmul_backward(Tensor(), dweight.cpu_view(), dlin_bias.cpu_view(), lin_out.cpu_view(), inp.cpu_view(),
                            weight.cpu_view());
      gpu().matmul_backward(Tensor(), dweight.device_view(), dlin_bias.device_view(), lin_out.device_view(),
                            inp.device_view(), weight.device_view());
      expect_close("matmul_backward dweight (f32)", dweight, gemm_tolerance(fp32));
      expect_close("matmul_backward dbias (f32)", dlin_bias, sums);
      // The embeddings' gradients, rows scattered by token.
      const int B = 2, T = 5, V = 11;
      Tokens tokens({B, T}, random_tokens(size_t(B) * T, V, 93));
      Twin edout({B, T, n}, f, on_grid(size_t(B) * T * c, 94, 1.0f, f));
      Twin dwte({V, n}, fp32, on_grid(size_t(V) * c, 95, 0.5f, fp32), DType::f32);
      Twin dwpe({T, n}, fp32, on_grid(size_t(T) * c, 96, 0.5f, fp32), DType::f32);
      cpu().embedding_backward(dwte.cpu_view(), dwpe.cpu_view(), edout.cpu_view(), tokens.cpu_view());
      gpu().embedding_backward(dwte.device_view(), dwpe.device_view(), edout.device_view(), tokens.device_view());
      expect_close("embedding_backward dwte (f32)", dwte, sums);
      expect_close("embedding_backward dwpe (f32)", dwpe, sums);
    }
}

// ---------------------------------------------------------------------------- reductions

TEST_CASE("gpu: sum, sum_squares and amax match the CPU backend", "[gpu]") {
  std::vector<int> sizes(std::begin(kSizes), std::end(kSizes));
  sizes.push_back(kB * kT * kC);
  sizes.push_back((1 << 20) + 3);
  for (const Format f : kFormats)
    for (const int n : sizes) {
      INFO(format_name(f) << " n=" << n);
      Twin t({n}, f, on_grid(size_t(n), 91, 3.0f, f));
      double magnitude = 0;
      for (const float x : t.host) magnitude += std::fabs(static_cast<double>(x));
      // Both accumulate in double, in different orders.
      const double sum_cpu = cpu().sum(t.cpu_view()), sum_gpu = gpu().sum(t.device_view());
      CHECK(std::fabs(sum_gpu - sum_cpu) <= 1e-10 * (1.0 + magnitude));
      const double sq_cpu = cpu().sum_squares(t.cpu_view()), sq_gpu = gpu().sum_squares(t.device_view());
      CHECK(std::fabs(sq_gpu - sq_cpu) <= 1e-10 * (1.0 + sq_cpu));
      CHECK(gpu().amax(t.device_view()) == cpu().amax(t.cpu_view()));
    }
  // Squares of large f32 values stay finite (accumulated in double); NaN propagates.
  Twin large({4}, Format::fp32, {1.0f, -2.0e30f, 3.0e38f, 0.5f});
  const double large_squares = gpu().sum_squares(large.device_view());
  CHECK(std::isfinite(large_squares));
  CHECK(std::fabs(large_squares - cpu().sum_squares(large.cpu_view())) <= 1e-12 * large_squares);
  CHECK(gpu().amax(large.device_view()) == 3.0e38f);
  Twin with_nan({3}, Format::fp32, {1.0f, NAN, -4.0f});
  CHECK(std::isnan(gpu().amax(with_nan.device_view())));
  CHECK(std::isnan(gpu().sum_squares(with_nan.device_view())));
  CHECK(std::isnan(gpu().sum(with_nan.device_view())));
}

// ---------------------------------------------------------------------------- FP8 casts

struct CastShape {
  int rows, cols;
};
const CastShape kCastShapes[] = {{1, 1}, {7, 19}, {19, 111}, {111, 769}, {129, 257}, {kB * kT, kC}};

TEST_CASE("gpu: fp8_cast equals the CPU emulation bit for bit", "[gpu]") {
  for (const Format f : kFormats)
    for (const Format f8 : {Format::e4m3, Format::e5m2})
      for (const float scale : {1.0f, 2.0f, 3.7f})
        for (const CastShape& s : kCastShapes) {
          INFO(format_name(f) << " -> " << format_name(f8) << " scale " << scale << " " << s.rows << "x" << s.cols);
          const size_t n = size_t(s.rows) * s.cols;
          Twin in({s.rows, s.cols}, f, wide_on_grid(n, 101, f));
          Twin out({s.rows, s.cols}, f8, zeros(n));  // f32 storage of dequantised values
          out.poison_device();
          const Fp8CastStats want = cpu().fp8_cast(out.cpu_view(), in.cpu_view(), f8, scale);
          const Fp8CastStats got = gpu().fp8_cast(out.device_view(), in.device_view(), f8, scale);
          expect_identical("fp8_cast out", out);
          expect_same_stats(got, want);
          if (n >= 1000) CHECK(want.underflow > 0);  // the inputs do reach the format's limits
          if (n >= 1000 && f8 == Format::e4m3) CHECK(want.saturated > 0);
        }
}

TEST_CASE("gpu: fp8_cast_blocks equals the CPU emulation bit for bit", "[gpu]") {
  struct Blocks {
    int rows, cols;
  };
  const Blocks kBlocks[] = {{1, 128}, {128, 128}, {128, 1}};
  for (const Format f : kFormats)
    for (const Format f8 : {Format::e4m3, Format::e5m2})
      for (const Blocks& b : kBlocks)
        for (const CastShape& s : kCastShapes) {
          INFO(format_name(f) << " -> " << format_name(f8) << " blocks " << b.rows << "x" << b.cols << " " << s.rows
                              << "x" << s.cols);
          const size_t n = size_t(s.rows) * s.cols;
          Twin in({s.rows, s.cols}, f, wide_on_grid(n, 102, f));
          Twin out({s.rows, s.cols}, f8, zeros(n));
          out.poison_device();
          const Fp8CastStats want = cpu().fp8_cast_blocks(out.cpu_view(), in.cpu_view(), f8, b.rows, b.cols);
          const Fp8CastStats got = gpu().fp8_cast_blocks(out.device_view(), in.device_view(), f8, b.rows, b.cols);
          expect_identical("fp8_cast_blocks out", out);
          expect_same_stats(got, want);
        }
}

// The FP8 activation store (precision.fp8.mlp_input_codes): three layers stored, then loaded in
// the other order into bf16 and f32 rooms, each the CPU's emulated store's values bit for bit
// (its 1x128 tiles' codes over their factors, rounded to the room's format); a load that read
// another layer's codes, or a store that wrote into another's, fails. A width off 128 leaves a
// ragged last tile.
TEST_CASE("gpu: the FP8 activation store gives back the CPU's emulated store's values bit for bit", "[gpu]") {
  const CastShape shapes[] = {{7, 300}, {kB * kT, 2 * kC}};
  for (const CastShape& s : shapes)
    for (const Format room : {Format::bf16, Format::fp32}) {
      INFO(s.rows << "x" << s.cols << " into " << format_name(room));
      const int layers = 3;
      const size_t n = size_t(s.rows) * s.cols;
      auto on_cpu = cpu().make_fp8_activation_store(layers, s.rows, s.cols, Format::e4m3);
      auto on_gpu = gpu().make_fp8_activation_store(layers, s.rows, s.cols, Format::e4m3);
      for (int l = 0; l < layers; ++l) {
        Twin in({s.rows, s.cols}, room, wide_on_grid(n, 200 + l, room));
        on_cpu->store(l, in.cpu_view(), true);
        on_gpu->store(l, in.device_view(), true);
      }
      // Each layer's statistics, counted on the device as on the CPU; a store not recorded (an
      // evaluation's) counts nowhere, and a take starts them afresh.
      {
        Twin again({s.rows, s.cols}, room, wide_on_grid(n, 200, room));
        on_cpu->store(0, again.cpu_view(), false);
        on_gpu->store(0, again.device_view(), false);
      }
      const std::vector<Fp8CastStats> want = on_cpu->take_stats(), got = on_gpu->take_stats();
      REQUIRE((want.size() == size_t(layers) && got.size() == want.size()));
      for (int l = 0; l < layers; ++l) {
        INFO("statistics of layer " << l);
        expect_same_stats(got[l], want[l]);
        CHECK(want[l].nonzero > 0);
        if (n >= 1000) CHECK(want[l].underflow > 0);  // the inputs reach below E4M3's range in a tile
      }
      for (const Fp8CastStats& taken : on_gpu->take_stats()) CHECK(taken.nonzero == 0);
      for (int l = layers - 1; l >= 0; --l) {
        INFO("layer " << l);
        Twin out({s.rows, s.cols}, room, zeros(n));
        out.poison_device();
        on_cpu->load(l, out.cpu_view());
        on_gpu->load(l, out.device_view());
        expect_identical("load", out);
        // And the values are the block cast's: the layer's own input, quantised.
        Twin in({s.rows, s.cols}, room, wide_on_grid(n, 200 + l, room));
        Twin cast({s.rows, s.cols}, room, zeros(n)), rounded({s.rows, s.cols}, room, zeros(n));
        cpu().fp8_cast_blocks(cast.cpu_view(), in.cpu_view(), Format::e4m3, 1, kFp8StoreTile);
        cpu().copy(rounded.cpu_view(), cast.cpu_view());  // rounded to the room's format
        CHECK(rounded.host == out.host);
      }
    }
}

// Native FP8 GEMMs (Backend::make_fp8_gemms) against the CPU's FP8 emulation of the same
// casts: dequantised values through an FP32-accumulating GEMM. The casts agree bit for bit (amax
// and counts); the GEMMs differ only in summation order (and the per-tensor forward's fast
// accumulation), so the outputs agree to bf16's tolerance. Per-tensor scales take the
// delayed/current recipes' path; block scales the block recipe's (1x128 input and grad tiles,
// 128x128 weight blocks, 128x1 tiles for wgrad), which needs every dimension a multiple of 128.
TEST_CASE("gpu: native FP8 GEMMs match the CPU's FP8 emulation", "[gpu]") {
  struct LinearShape {
    int rows, C, OC;
  };
  const LinearShape shapes[] = {{64, 128, 512}, {kB * kT, kC, 3 * kC}, {kB * kT, 4 * kC, kC}, {256, 1024, 1024}};
  const Format f = Format::bf16;
  using Scaling = Fp8Gemms::Scaling;
  for (const Scaling scaling : {Scaling::tensor, Scaling::blocks})
    for (const Format grad_format : {Format::e5m2, Format::e4m3})
      for (const LinearShape& s : shapes) {
        const bool blocks = scaling == Scaling::blocks;
        INFO((blocks ? "block" : "per-tensor") << " scaling, rows " << s.rows << " C " << s.C << " OC " << s.OC
                                               << ", grads " << format_name(grad_format));
        std::string why;
        const std::unique_ptr<Fp8Gemms> gemms = gpu().make_fp8_gemms(s.rows, s.C, s.OC, scaling, Format::e4m3, grad_format,
                                                                     -1, Fp8Gemms::WeightCodes::own, &why);
        INFO(why);
        if (blocks && s.rows % 128 != 0) {  // refused, saying why
          CHECK_FALSE(gemms);
          CHECK_THAT(why, Catch::Contains("multiples of 128"));
          continue;
        }
        REQUIRE(gemms);
        const size_t n_in = size_t(s.rows) * s.C, n_w = size_t(s.OC) * s.C, n_out = size_t(s.rows) * s.OC;
        Twin inp({s.rows, s.C}, f, on_grid(n_in, 131, 3.0f, f)), weight({s.OC, s.C}, f, on_grid(n_w, 132, 0.05f, f));
        Twin bias({s.OC}, f, on_grid(size_t(s.OC), 133, 0.5f, f)), dout({s.rows, s.OC}, f, on_grid(n_out, 134, 1e-3f, f));
        Twin out({s.rows, s.OC}, f, zeros(n_out));
        Twin dinp({s.rows, s.C}, f, on_grid(n_in, 135, 0.01f, f)), dweight({s.OC, s.C}, f, on_grid(n_w, 136, 0.01f, f));
        out.poison_device();
        // The CPU: dequantised copies, then its GEMMs. Block scaling casts input and grad twice.
        std::vector<float> inp_q(n_in), weight_q(n_w), dout_q(n_out), inp_qt(n_in), dout_qt(n_out);
        const auto q_view = [](std::vector<float>& v, int64_t r, int64_t c, Format f8) {
          Tensor t(v.data(), DType::f32, {r, c});
          t.format = f8;
          return t;
        };
        struct Cast {
          Fp8Gemms::Operand operand;
          Twin* in;
          std::vector<float>* q;
          int64_t rows, cols;
          Format format;
          int block_rows, block_cols;
        };
        std::vector<Cast> casts = {Cast{Fp8Gemms::kInput, &inp, &inp_q, s.rows, s.C, Format::e4m3, 1, 128},
                                   Cast{Fp8Gemms::kWeight, &weight, &weight_q, s.OC, s.C, Format::e4m3, 128, 128},
                                   Cast{Fp8Gemms::kGrad, &dout, &dout_q, s.rows, s.OC, grad_format, 1, 128}};
        if (blocks) {
          casts.push_back(Cast{Fp8Gemms::kInput, &inp, &inp_qt, s.rows, s.C, Format::e4m3, 128, 1});
          casts.push_back(Cast{Fp8Gemms::kGrad, &dout, &dout_qt, s.rows, s.OC, grad_format, 128, 1});
        }
        // Each cast's statistics (taken right after it) equal the CPU's; an unrecorded cast (an
        // evaluation's) leaves none; current scaling finds the CPU's scale on the device.
        const auto taken = [&](Fp8Gemms::Operand operand) { return gemms->take_stats()[operand]; };
        for (const Cast& c : casts) {
          INFO("cast of operand " << c.operand << " in " << c.block_rows << "x" << c.block_cols << " blocks");
          const Tensor q = q_view(*c.q, c.rows, c.cols, c.format);
          if (blocks) {
            gemms->cast_blocks(c.operand, c.in->device_view(), c.format, c.block_rows, c.block_cols, false);
            expect_same_stats(taken(c.operand).stats, Fp8CastStats{});
            const Fp8CastStats want = cpu().fp8_cast_blocks(q, c.in->cpu_view(), c.format, c.block_rows, c.block_cols);
            gemms->cast_blocks(c.operand, c.in->device_view(), c.format, c.block_rows, c.block_cols, true);
            expect_same_stats(taken(c.operand).stats, want);
          } else {
            const float scale = current_scale(cpu().amax(c.in->cpu_view()), format_max(c.format));
            const Fp8CastStats want = cpu().fp8_cast(q, c.in->cpu_view(), c.format, scale);
            gemms->cast_current(c.operand, c.in->device_view(), c.format, true);
            const Fp8Gemms::OperandStats current = taken(c.operand);
            expect_same_stats(current.stats, want);
            CHECK(std::memcmp(&current.scale, &scale, sizeof(float)) == 0);
            gemms->cast(c.operand, c.in->device_view(), c.format, scale, false);
            expect_same_stats(taken(c.operand).stats, Fp8CastStats{});
            gemms->cast(c.operand, c.in->device_view(), c.format, scale, true);
            expect_same_stats(taken(c.operand).stats, want);
          }
        }
        const Tensor in_q = q_view(inp_q, s.rows, s.C, Format::e4m3), w_q = q_view(weight_q, s.OC, s.C, Format::e4m3);
        const Tensor g_q = q_view(dout_q, s.rows, s.OC, grad_format);
        cpu().matmul_forward(out.cpu_view(), in_q, w_q, bias.cpu_view());
        cpu().matmul_backward(dinp.cpu_view(), Tensor(), Tensor(), g_q, in_q, w_q);
        cpu().matmul_backward(Tensor(), dweight.cpu_view(), Tensor(),
                              blocks ? q_view(dout_qt, s.rows, s.OC, grad_format) : g_q,
                              blocks ? q_view(inp_qt, s.rows, s.C, Format::e4m3) : in_q, w_q);
        gemms->forward(out.device_view(), bias.device_view());
        gemms->backward(dinp.device_view(), dweight.device_view());
        // Per-tensor forward: fast accumulation, TransformerEngine's forward setting.
        expect_close("fp8 forward", out, blocks ? tolerance(f) : 2e-2);
        expect_close("fp8 dgrad", dinp, op_tolerance(f));
        expect_close("fp8 wgrad", dweight, op_tolerance(f));
      }
}

// GEMMs handed their weight's codes (Fp8Gemms::WeightCodes::handed: ZeRO-3's primary FP8
// weights, gathered into a room) keep no codes of their own: bound to a copy of the codes that
// another layer's cast of the weight made, and given that cast's scales (one per tensor, or one
// per 128x128 block), they compute what that layer computes, bit for bit.
TEST_CASE("gpu: FP8 GEMMs handed their weight's codes compute what their own cast gives", "[gpu]") {
  constexpr int rows = 256, C = 256, OC = 384, kBlock = 128;
  const Format f = Format::bf16;
  using Scaling = Fp8Gemms::Scaling;
  for (const Scaling scaling : {Scaling::tensor, Scaling::blocks}) {
    const bool blocks = scaling == Scaling::blocks;
    INFO((blocks ? "block" : "per-tensor") << " scaling");
    std::string why;
    const std::unique_ptr<Fp8Gemms> own = gpu().make_fp8_gemms(rows, C, OC, scaling, Format::e4m3, Format::e5m2, -1,
                                                               Fp8Gemms::WeightCodes::own, &why);
    const std::unique_ptr<Fp8Gemms> handed = gpu().make_fp8_gemms(rows, C, OC, scaling, Format::e4m3, Format::e5m2, -1,
                                                                  Fp8Gemms::WeightCodes::handed, &why);
    INFO(why);
    REQUIRE(own);
    REQUIRE(handed);
    CHECK_THROWS(handed->weight_codes());
    Twin inp({rows, C}, f, on_grid(size_t(rows) * C, 141, 3.0f, f));
    Twin weight({OC, C}, f, on_grid(size_t(OC) * C, 142, 0.05f, f));
    Twin dout({rows, OC}, f, on_grid(size_t(rows) * OC, 143, 1e-3f, f));
    // The scales of one cast of the whole weight: fp8_max / amax, of the tensor or of each block.
    const float max = format_max(Format::e4m3);
    std::vector<float> scales;
    if (blocks) {
      std::vector<float> amaxes(size_t(OC / kBlock) * (C / kBlock), 0.0f);
      cpu().fp8_block_amaxes(amaxes.data(), weight.cpu_view(), 0, C, kBlock, kBlock);
      for (const float a : amaxes) scales.push_back(current_scale(a, max));
      own->cast_blocks(Fp8Gemms::kWeight, weight.device_view(), Format::e4m3, kBlock, kBlock, true);
    } else {
      scales = {current_scale(cpu().amax(weight.cpu_view()), max)};
      own->cast(Fp8Gemms::kWeight, weight.device_view(), Format::e4m3, scales[0], true);
    }
    void* room = gpu().allocate(size_t(OC) * C);
    const Tensor codes(room, DType::u8, {OC, C}, Device::cuda);
    gpu().copy(codes, own->weight_codes());
    handed->set_weight_scales(Format::e4m3, scales);
    handed->bind_weight_codes(codes);
    // Each runs the three GEMMs on the same input and output gradient (whose codes the two share
    // by shape, so one after the other).
    struct Outputs {
      std::vector<float> out, dinp, dweight;
    };
    const auto run = [&](Fp8Gemms& g) {
      if (blocks) {
        g.cast_blocks(Fp8Gemms::kInput, inp.device_view(), Format::e4m3, 1, kBlock, true);
        g.cast_blocks(Fp8Gemms::kInput, inp.device_view(), Format::e4m3, kBlock, 1, true);
        g.cast_blocks(Fp8Gemms::kGrad, dout.device_view(), Format::e5m2, 1, kBlock, true);
        g.cast_blocks(Fp8Gemms::kGrad, dout.device_view(), Format::e5m2, kBlock, 1, true);
      } else {
        g.cast_current(Fp8Gemms::kInput, inp.device_view(), Format::e4m3, true);
        g.cast_current(Fp8Gemms::kGrad, dout.device_view(), Format::e5m2, true);
      }
      Twin out({rows, OC}, f, zeros(size_t(rows) * OC)), dinp({rows, C}, f, zeros(size_t(rows) * C));
      Twin dweight({OC, C}, Format::fp32, zeros(size_t(OC) * C));
      g.forward(out.device_view(), Tensor());
      g.backward(dinp.device_view(), dweight.device_view());
      return Outputs{out.from_device(), dinp.from_device(), dweight.from_device()};
    };
    const Outputs want = run(*own), got = run(*handed);
    gpu().release(room);
    CHECK(got.out == want.out);
    CHECK(got.dinp == want.dinp);
    CHECK(got.dweight == want.dweight);
  }
}

// ---------------------------------------------------------------------------- optimizer

TEST_CASE("gpu: adamw matches the CPU backend and writes the low-precision copy", "[gpu]") {
  std::vector<int> sizes(std::begin(kSizes), std::end(kSizes));
  sizes.push_back((1 << 16) + 5);
  for (const Format f : kFormats)
    for (const int n : sizes)
      for (const int64_t step : {int64_t(1), int64_t(7)}) {
        INFO(format_name(f) << " n=" << n << " step " << step);
        const size_t count = size_t(n);
        AdamWParams p;
        p.lr = 1e-3f;
        p.weight_decay = 0.1f;
        p.grad_scale = 0.5f;
        p.step = step;
        std::vector<float> v0 = on_grid(count, 114, 0.01f, Format::fp32);
        for (float& x : v0) x = std::fabs(x);
        Twin param({n}, Format::fp32, on_grid(count, 111, 1.0f, Format::fp32));
        Twin grad({n}, f, on_grid(count, 112, 1.0f, f));
        Twin m({n}, Format::fp32, on_grid(count, 113, 0.1f, Format::fp32)), v({n}, Format::fp32, v0);
        // The copy in the gradient's format (fused into the update) and, for every format, a
        // bf16 copy (written by copy() when the dtypes differ).
        Twin copy({n}, f == Format::fp32 ? Format::bf16 : f, zeros(count));
        copy.poison_device();
        cpu().adamw(param.cpu_view(), grad.cpu_view(), m.cpu_view(), v.cpu_view(), p, copy.cpu_view());
        gpu().adamw(param.device_view(), grad.device_view(), m.device_view(), v.device_view(), p, copy.device_view());
        expect_close("adamw param", param, 1e-6);
        expect_close("adamw m", m, 1e-6);
        expect_close("adamw v", v, 1e-6);
        expect_close("adamw copy", copy, op_tolerance(f == Format::fp32 ? Format::bf16 : f));
        // Without a copy.
        cpu().adamw(param.cpu_view(), grad.cpu_view(), m.cpu_view(), v.cpu_view(), p, Tensor());
        gpu().adamw(param.device_view(), grad.device_view(), m.device_view(), v.device_view(), p, Tensor());
        expect_close("adamw param, second step without a copy", param, 1e-6);
      }
}

}  // namespace
}  // namespace ptrain::test
