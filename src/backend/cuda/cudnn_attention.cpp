// Causal scaled-dot-product attention ("flash attention") through cuDNN 9's graph (backend) C API.
//
// What this is
// ------------
// The forward pass computes, per (batch, head), S = scale * Q K^T, masks it causally (query t sees
// keys <= t), takes the row softmax P and writes O = P V plus the FP32 row statistic
// stats = max + log(sum exp) that the backward pass uses to recompute P. The backward pass
// recomputes P from Q, K and stats and writes dQ, dK, dV. cuDNN fuses each graph into one
// flash-attention kernel (plus small helper kernels); S and P never reach memory.
//
// Why a composite graph, built by hand
// ------------------------------------
// cudnn-frontend (the header-only C++ wrapper NVIDIA's samples and llm.c use) is not available,
// so the graphs are built from backend descriptors directly. cuDNN 9.19 also has the unified
// CUDNN_BACKEND_OPERATION_SDPA_FWD/BWD_DESCRIPTOR ops, but the frontend only uses the forward one
// from 9.13.1 and causal masks on it need 9.21; the unified backward was reported to have no engines (JuliaGPU/CUDA.jl pull request 3238).
// For cuDNN < 9.21 the frontend instead lowers sdpa()/sdpa_backward() to composite graphs of
// MATMUL, POINTWISE, REDUCTION and RESHAPE operations, and cuDNN's fused-attention engines
// recognise exactly those patterns. The graphs below reproduce that lowering op by op, with the
// same tensor data types and (virtual) layouts, rather than an equivalent "cleaner" graph, which
// the engines might not match. Source: NVIDIA/cudnn-frontend v1.23 (commit 3929da2),
// include/cudnn_frontend/node/scaled_dot_product_flash_attention.h (CompositeSDPANode,
// CompositeSDPABackwardNode), node/softmax.h (CompositeSoftmaxNode), node/diagonal_band_mask.h
// (CompositeDiagonalBandMaskNode), utils/attn_score_modifiers.h (causal_mask =
// sliding_window_mask with right bound 0, top-left aligned). Where the frontend fills defaults:
// virtual tensors are FP32 ("intermediate data type"), pointwise/matmul/reduction compute FP32,
// the comparison computes in BOOLEAN, by-value scalars are FP32 tensors of dims (1) and strides (1), every
// tensor is declared 16-byte aligned, and reductions get CUDNN_ATTR_REDUCTION_IS_DETERMINISTIC =
// false (cuDNN >= 9.11), as the frontend sets for every reduction node.
//
// Forward graph (uids: Q 1, K^T 2, V 3, O 4, stats 5, scale 10, -inf 11; virtual tensors 100+):
//   S  = Q K^T              MATMUL                          (B,NH,T,T) FP32
//   S *= scale              POINTWISE MUL (by-value scale)
//   r, c = row, col index   POINTWISE GEN_INDEX axis 2 / 3  INT32
//   keep = r >= c           POINTWISE CMP_GE                BOOLEAN
//   S  = keep ? S : -inf    POINTWISE BINARY_SELECT (by-value -inf)
//   m  = rowmax(S)          REDUCTION MAX                   (B,NH,T,1)
//   E  = exp(S - m)         POINTWISE SUB, EXP
//   l  = rowsum(E)          REDUCTION ADD
//   stats = m + log(l)      POINTWISE LOG, ADD              -> stats (FP32, output)
//   P  = E / l              POINTWISE DIV                   16-bit (bmm2's A operand)
//   O  = P V                MATMUL                          -> O
// Backward graph (uids: Q 1, K^T 2, V^T 3, O 4, stats 5, dO 6, dQ 7, dK 8, dV 9, scale 10, -inf 11,
// one 12, softmax_sum 13, dQ accumulator 14):
//   softmax_sum = rowsum(dO * O) * 1     POINTWISE MUL, REDUCTION ADD, POINTWISE MUL (by-value 1)
//                                        -> FP32 (B,NH,T,1) in the workspace (a real tensor: cuDNN
//                                        computes it in a pre-pass kernel)
//   S  = (Q K^T) * scale - stats         MATMUL, POINTWISE MUL, SUB
//   P  = exp(causal mask of S)           the forward's mask ops, then POINTWISE EXP
//   dV = P^T dO                          RESHAPE (transposed 16-bit view of P), MATMUL
//   dP = dO V^T                          MATMUL
//   dS = P * (dP - softmax_sum) * scale  POINTWISE SUB, MUL, MUL
//   dK = dS^T Q                          RESHAPE (transposed 16-bit view of dS), MATMUL
//   dQ = dS K                            RESHAPE (K^T viewed back as K), MATMUL, either into the FP32
//                                        accumulator (uid 14, in the workspace) + POINTWISE IDENTITY
//                                        into dQ, or straight into dQ (the deterministic variant)
// That is 14 operations forward and 22 (21 deterministic) backward.
//
// Grouped-query attention (KV K/V heads under NH query heads, NH a multiple of KV) follows the
// frontend's lowering too: K^T, V and V^T are declared with KV heads, and the matmuls pair query
// head h with K/V head h / (NH / KV) (their batch dimension broadcasts by groups, "b (hk g)" in the
// frontend's einsum comments). The backward's dK and dV are computed per query head into virtual
// 16-bit (B,NH,T,HS) tensors and summed over each group by a REDUCTION ADD into (B,KV,T,HS):
// two more operations, and no extra workspace for ptrain's non-ragged layout.
//
// Layout
// ------
// ptrain keeps q, k, v interleaved per token in qkv (B, T, W), C = NH * HS, W = C + 2 * KV * HS.
// As 4-D tensors Q (B, NH, T, HS), K and V (B, KV, T, HS) have strides (T*W, HS, W, 1) from base
// pointers qkv, qkv + C and qkv + C + KV*HS elements; the backend's attention matmuls take K (and
// in the backward V) transposed, (B, KV, HS, T) with the last two strides swapped (no data moves).
// O and dO are (B, T, C): strides (T*C, HS, C, 1). dQ, dK, dV are written with Q's strides into
// dqkv. stats is (B, NH, T, 1) FP32, packed. HS % 8 == 0 keeps every head and the K/V base
// pointers 16-byte aligned (C and W are then multiples of 8 too).
//
// Determinism (what was found)
// ----------------------------
// There is no "deterministic" attribute for these graphs in the backend API. cudnn-frontend's
// SDPA_backward_attributes::set_deterministic_algorithm(true) maps to:
//  * every GPU: the "dP workspace" graph variant: dQ = dS K is written straight into dQ, with no
//    FP32 dQ accumulator and no IDENTITY op (CompositeSDPABackwardNode::expand_node: "Force dP
//    workspace implementation if ... the user force requests deterministic algorithm on hopper").
//    The default variant accumulates dQ in FP32 across key tiles with atomics: not reproducible.
//    On Hopper the dP variant is the deterministic kernel: TransformerEngine PR #992 (support
//    table: cuDNN "sub-backend 1: workspace optimization path and sm90+: yes; otherwise: no") and
//    cudnn-frontend PR #398 ("On Hopper, use_deterministic_algorithm on the SDPA backward always
//    forced the dP-workspace decomposition. Its workspace is quadratic in sequence length");
//    llm.c asks for it (set_deterministic_algorithm(true)) on H100. Its plan workspace is about
//    B * NH * roundup(T, 64)^2 * 2 bytes (e.g. 384 MiB for B=16, NH=12, T=1024); cuDNN 9.25 adds a
//    linear-workspace deterministic engine (PR #398), not used here.
//  * data-center Blackwell (sm100/sm103) additionally: cuDNN >= 9.18 and an engine override instead
//    of heuristics (override_heuristics_query): global engine 5 (17 above sm103) with knobs
//    KERNEL_CFG=31, STAGES=2 (cuDNN < 9.23) or TILE_M=3, TILE_N=2, KERNEL_CFG=2, STREAM_K=0,
//    TILE_CGA_M=0, STAGES=2 (cuDNN >= 9.23). TransformerEngine PR #2584 documents the same floor.
//  * other GPUs (Ampere, Ada, sm120): no deterministic cuDNN attention backward is documented, so
//    with deterministic = true supported() says so and the caller uses its fallback.
// The forward pass has a single implementation and is deterministic. cuDNN also reports per-engine
// numerical notes (CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC); they describe an engine, not the graph
// variant it runs, so they are recorded in plan_summary() but do not filter engines.
//
// Workspace and caching
// ---------------------
// Building and finalizing a plan takes hundreds of milliseconds, so supported() builds both plans
// once per SdpaShape and caches them (and unsupported answers). The caller's workspace serves both
// passes: forward = the forward plan's workspace; backward = [softmax_sum, FP32 (B,NH,T)]
// [dQ accumulator, FP32 (B,NH,T,HS), non-deterministic variant only][the backward plan's
// workspace], each part 256-byte aligned (the frontend's parts, in another order). cuDNN >= 9.6 zeroes the
// accumulator itself (the frontend stopped memsetting it); older versions get a cudaMemsetAsync.
// Descriptors are owned by RAII handles (Desc) so nothing leaks when a call throws.
//
// Doubts a GPU run must settle: that these graphs (the grouped-query ones above all) find engines at all (the op list and types follow
// the frontend, but nothing here was run); that the outputs match the fallback attention, with
// extra care for the strides of K^T/V^T and dK/dV; that two deterministic backward runs are bitwise
// equal on the target GPU, grouped K/V heads included (the group reduction is cuDNN's); the dP-workspace plan's workspace size at the training shapes. Details
// copied from the frontend that a failure would point at first: GEN_INDEX computes in FP32 (v1.23;
// v1.5 used INT32), the K view for dQ = dS K is declared FP32 although K is 16-bit, and the virtual
// dO * O product has the frontend's aliasing strides.
//
// Compiled only into CUDA builds (PTRAIN_HAVE_CUDA); links cudnn.
#ifdef PTRAIN_HAVE_CUDA

#include "backend/cuda/cudnn_attention.h"

#include <cudnn.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_error.h"
#include "backend/cuda/library_log.h"
#include "core/error.h"

namespace ptrain {

namespace {

using Dims = std::array<int64_t, 4>;

// Tensor uids. Graph inputs and outputs are 1..14; virtual tensors are numbered from 100.
constexpr int64_t kUidQ = 1;      // Q view of qkv (B,NH,T,HS)
constexpr int64_t kUidK = 2;      // K^T view of qkv (B,KV,HS,T)
constexpr int64_t kUidV = 3;      // V view (forward) / V^T view (backward) of qkv
constexpr int64_t kUidO = 4;      // attention output (B,NH,T,HS) in (B,T,C)
constexpr int64_t kUidStats = 5;  // FP32 (B,NH,T,1) log-sum-exp
constexpr int64_t kUidDO = 6;     // output gradient (B,NH,T,HS) in (B,T,C)
constexpr int64_t kUidDQ = 7;     // gradients, Q's layout in dqkv
constexpr int64_t kUidDK = 8;
constexpr int64_t kUidDV = 9;
constexpr int64_t kUidScale = 10;       // by value: attention scale
constexpr int64_t kUidNegInf = 11;      // by value: the masked score (-inf)
constexpr int64_t kUidOne = 12;         // by value: 1.0f (the frontend's dropout-free softmax_sum scale)
constexpr int64_t kUidSoftmaxSum = 13;  // FP32 (B,NH,T,1) rowsum(dO * O), in the workspace
constexpr int64_t kUidDQAccum = 14;     // FP32 (B,NH,T,HS) dQ accumulator, in the workspace
constexpr int64_t kFirstVirtualUid = 100;

constexpr size_t kElementBytes = 2;  // bf16 and fp16
constexpr int64_t kTensorAlignment = 16;
constexpr size_t kWorkspaceAlignment = 256;

// RAII owner of one backend descriptor (cudnnBackendDescriptor_t is void*).
struct DescriptorDeleter {
  void operator()(void* d) const noexcept {
    if (d) (void)cudnnBackendDestroyDescriptor(d);
  }
};
using Desc = std::unique_ptr<void, DescriptorDeleter>;

bool is_not_supported(long long status) { return status / 1000 == 3; }  // CUDNN_STATUS_NOT_SUPPORTED*

std::string version_text(int64_t v) {
  return std::to_string(v / 10000) + "." + std::to_string(v % 10000 / 100) + "." + std::to_string(v % 100);
}

std::string dtype_name(cudaDataType_t t) {
  switch (t) {
    case CUDA_R_16BF: return "bf16";
    case CUDA_R_16F: return "fp16";
    case CUDA_R_32F: return "fp32";
    default: return "cudaDataType " + std::to_string(static_cast<int>(t));
  }
}

// "CUDNN_STATUS_NOT_SUPPORTED_SHAPE (<cuDNN's last error message>)"
std::string status_text(cudnnStatus_t status) {
  const char* name = cudnnGetErrorString(status);
  std::string text = name && *name ? name : "cuDNN status " + std::to_string(static_cast<int>(status));
  char detail[512] = {0};
  cudnnGetLastErrorString(detail, sizeof(detail));
  if (detail[0]) text += std::string(" (") + detail + ")";
  return text;
}

void check(cudnnStatus_t status, const char* what, int line) {
  if (status != CUDNN_STATUS_SUCCESS) throw_cudnn_error(static_cast<int>(status), what, __FILE__, line);
}

// The failing attribute or descriptor is named in the CudaError's expression.
#define PTRAIN_CUDNN_SET(desc, name, type, count, values)                                        \
  check(cudnnBackendSetAttribute((desc), (name), (type), static_cast<int64_t>(count), (values)), \
        "cudnnBackendSetAttribute(" #name ")", __LINE__)
#define PTRAIN_CUDNN_FINALIZE(desc, what) check(cudnnBackendFinalize(desc), "cudnnBackendFinalize(" what ")", __LINE__)

Desc create(cudnnBackendDescriptorType_t type) {
  cudnnBackendDescriptor_t d = nullptr;
  PTRAIN_CUDNN_CHECK(cudnnBackendCreateDescriptor(type, &d));
  return Desc(d);
}

size_t align_up(size_t bytes) { return (bytes + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment; }

bool aligned(const void* p, size_t alignment) { return reinterpret_cast<uintptr_t>(p) % alignment == 0; }

// A finalized tensor descriptor and the shape it was declared with (pointwise outputs reuse it).
struct GraphTensor {
  cudnnBackendDescriptor_t desc = nullptr;
  Dims dims{};
  Dims strides{};
};

// Builds one operation graph; owns every tensor and operation descriptor it creates.
class GraphBuilder {
 public:
  explicit GraphBuilder(int64_t cudnn_version) : cudnn_version_(cudnn_version) {}

  // A graph input or output (a device pointer in the variant pack).
  GraphTensor tensor(int64_t uid, const Dims& dims, const Dims& strides, cudnnDataType_t type) {
    return make(uid, dims, strides, type, /*is_virtual=*/false, /*by_value=*/false);
  }
  // An FP32 scalar passed by value (a host pointer in the variant pack).
  // Rank 1, as cudnn-frontend declares its scalars (Tensor_attributes(float): dim = stride = {1}).
  GraphTensor scalar(int64_t uid) {
    return make(uid, {1, 1, 1, 1}, {1, 1, 1, 1}, CUDNN_DATA_FLOAT, /*is_virtual=*/false, /*by_value=*/true,
                /*rank=*/1);
  }
  // An intermediate that never reaches memory.
  GraphTensor virt(const Dims& dims, const Dims& strides, cudnnDataType_t type = CUDNN_DATA_FLOAT) {
    return make(next_virtual_uid_++, dims, strides, type, /*is_virtual=*/true, /*by_value=*/false);
  }
  GraphTensor virt_like(const GraphTensor& t, cudnnDataType_t type = CUDNN_DATA_FLOAT) {
    return virt(t.dims, t.strides, type);
  }

  // c = a b over the last two dimensions, batched over the first two; FP32 accumulation.
  void matmul(const GraphTensor& a, const GraphTensor& b, const GraphTensor& c) {
    Desc mm = create(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
    PTRAIN_CUDNN_SET(mm.get(), CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute);
    PTRAIN_CUDNN_FINALIZE(mm.get(), "matmul descriptor");
    Desc op = create(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    const cudnnBackendDescriptor_t mm_raw = mm.get();
    PTRAIN_CUDNN_SET(op.get(), CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a.desc);
    PTRAIN_CUDNN_SET(op.get(), CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b.desc);
    PTRAIN_CUDNN_SET(op.get(), CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c.desc);
    PTRAIN_CUDNN_SET(op.get(), CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mm_raw);
    PTRAIN_CUDNN_FINALIZE(op.get(), "matmul operation");
    keep(std::move(mm));
    add_operation(std::move(op));
  }

  void unary(cudnnPointwiseMode_t mode, const GraphTensor& x, const GraphTensor& y) {
    pointwise(mode, x, nullptr, nullptr, y, CUDNN_DATA_FLOAT, -1);
  }
  void binary(cudnnPointwiseMode_t mode, const GraphTensor& x, const GraphTensor& b, const GraphTensor& y,
              cudnnDataType_t math = CUDNN_DATA_FLOAT) {
    pointwise(mode, x, &b, nullptr, y, math, -1);
  }
  // y = t ? x : b
  void select(const GraphTensor& x, const GraphTensor& b, const GraphTensor& t, const GraphTensor& y) {
    pointwise(CUDNN_POINTWISE_BINARY_SELECT, x, &b, &t, y, CUDNN_DATA_FLOAT, -1);
  }
  // y = the index along `axis` of each element of x's shape
  void gen_index(const GraphTensor& x, int64_t axis, const GraphTensor& y) {
    pointwise(CUDNN_POINTWISE_GEN_INDEX, x, nullptr, nullptr, y, CUDNN_DATA_FLOAT, axis);
  }

  // y = reduction of x over the dimensions where y has extent 1, and over groups of consecutive
  // indices where y's extent divides x's (the grouped K/V heads' gradients).
  void reduction(cudnnReduceTensorOp_t mode, const GraphTensor& x, const GraphTensor& y) {
    Desc red = create(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
    PTRAIN_CUDNN_SET(red.get(), CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode);
    PTRAIN_CUDNN_SET(red.get(), CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute);
#if CUDNN_VERSION >= 91100
    if (cudnn_version_ >= 91100) {  // the attribute exists from 9.11; the frontend always sets it
      const bool deterministic = false;
      PTRAIN_CUDNN_SET(red.get(), CUDNN_ATTR_REDUCTION_IS_DETERMINISTIC, CUDNN_TYPE_BOOLEAN, 1, &deterministic);
    }
#endif
    PTRAIN_CUDNN_FINALIZE(red.get(), "reduction descriptor");
    Desc op = create(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    const cudnnBackendDescriptor_t red_raw = red.get();
    PTRAIN_CUDNN_SET(op.get(), CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &red_raw);
    PTRAIN_CUDNN_SET(op.get(), CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x.desc);
    PTRAIN_CUDNN_SET(op.get(), CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y.desc);
    PTRAIN_CUDNN_FINALIZE(op.get(), "reduction operation");
    keep(std::move(red));
    add_operation(std::move(op));
  }

  // y = x seen with y's dims and strides (a view; nothing moves).
  void reshape(const GraphTensor& x, const GraphTensor& y) {
    Desc op = create(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    PTRAIN_CUDNN_SET(op.get(), CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x.desc);
    PTRAIN_CUDNN_SET(op.get(), CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y.desc);
    PTRAIN_CUDNN_FINALIZE(op.get(), "reshape operation");
    add_operation(std::move(op));
  }

  // The finalized operation graph of every operation added, in the order added (the frontend's).
  // A NOT_SUPPORTED status here throws a CudaError that supported() turns into a reason.
  Desc finalize(cudnnHandle_t handle) {
    Desc graph = create(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    // Optional since cuDNN 9.8 (and deprecated), required before; the frontend sets it too.
    PTRAIN_CUDNN_SET(graph.get(), CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
    PTRAIN_CUDNN_SET(graph.get(), CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, operations_.size(),
                     operations_.data());
    PTRAIN_CUDNN_FINALIZE(graph.get(), "operation graph");
    return graph;
  }

  std::vector<Desc> take_owned() { return std::move(owned_); }

 private:
  // rank: how many of dims and strides the descriptor declares (the leading ones).
  GraphTensor make(int64_t uid, const Dims& dims, const Dims& strides, cudnnDataType_t type, bool is_virtual,
                   bool by_value, int64_t rank = 4) {
    Desc d = create(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    PTRAIN_CUDNN_SET(d.get(), CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
    PTRAIN_CUDNN_SET(d.get(), CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, rank, dims.data());
    PTRAIN_CUDNN_SET(d.get(), CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, rank, strides.data());
    PTRAIN_CUDNN_SET(d.get(), CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    PTRAIN_CUDNN_SET(d.get(), CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &kTensorAlignment);
    if (is_virtual) {
      const bool yes = true;
      PTRAIN_CUDNN_SET(d.get(), CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &yes);
    }
    if (by_value) {
      const bool yes = true;
      PTRAIN_CUDNN_SET(d.get(), CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &yes);
    }
    PTRAIN_CUDNN_FINALIZE(d.get(), "tensor");
    GraphTensor t;
    t.desc = d.get();
    t.dims = dims;
    t.strides = strides;
    keep(std::move(d));
    return t;
  }

  // One pointwise operation: X [, B [, T]] -> Y with the given math precision.
  void pointwise(cudnnPointwiseMode_t mode, const GraphTensor& x, const GraphTensor* b, const GraphTensor* t,
                 const GraphTensor& y, cudnnDataType_t math, int64_t axis) {
    Desc pw = create(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    PTRAIN_CUDNN_SET(pw.get(), CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    PTRAIN_CUDNN_SET(pw.get(), CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &math);
    if (mode == CUDNN_POINTWISE_GEN_INDEX)
      PTRAIN_CUDNN_SET(pw.get(), CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    PTRAIN_CUDNN_FINALIZE(pw.get(), "pointwise descriptor");
    Desc op = create(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    const cudnnBackendDescriptor_t pw_raw = pw.get();
    PTRAIN_CUDNN_SET(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw_raw);
    PTRAIN_CUDNN_SET(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x.desc);
    if (b) PTRAIN_CUDNN_SET(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b->desc);
    if (t) PTRAIN_CUDNN_SET(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t->desc);
    PTRAIN_CUDNN_SET(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y.desc);
    const float one = 1.0f;  // the frontend always sets both blend factors to 1
    PTRAIN_CUDNN_SET(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one);
    PTRAIN_CUDNN_SET(op.get(), CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one);
    PTRAIN_CUDNN_FINALIZE(op.get(), "pointwise operation");
    keep(std::move(pw));
    add_operation(std::move(op));
  }

  void keep(Desc d) { owned_.push_back(std::move(d)); }
  void add_operation(Desc op) {
    operations_.push_back(op.get());
    keep(std::move(op));
  }

  int64_t cudnn_version_;
  int64_t next_virtual_uid_ = kFirstVirtualUid;
  std::vector<Desc> owned_;
  std::vector<cudnnBackendDescriptor_t> operations_;
};

// The 4-D shapes and strides of one attention call (see "Layout" above).
struct AttentionDims {
  int64_t B, H, KV, T, D, C, W;
  explicit AttentionDims(const SdpaShape& s)
      : B(s.B), H(s.NH), KV(s.KV), T(s.T), D(s.HS), C(s.NH * s.HS), W((s.NH + 2 * s.KV) * s.HS) {}

  bool grouped() const { return KV != H; }
  Dims bhtd() const { return {B, H, T, D}; }   // Q, O and their gradients; per-query-head dK, dV
  Dims bktd() const { return {B, KV, T, D}; }  // K, V, dK, dV
  Dims bkdt() const { return {B, KV, D, T}; }  // K^T, V^T
  Dims qkv_strides() const { return {T * W, D, W, 1}; }    // Q, K, V, dQ, dK, dV in (B,T,W)
  Dims qkv_t_strides() const { return {T * W, D, 1, W}; }  // K^T, V^T
  Dims packed_strides() const { return {H * T * D, T * D, D, 1}; }  // a (B,NH,T,HS) tensor of its own
  Dims out_strides() const { return {T * C, D, C, 1}; }            // O, dO in (B,T,C)
  Dims scores() const { return {B, H, T, T}; }
  Dims score_strides() const { return {H * T * T, T * T, T, 1}; }
  Dims score_t_strides() const { return {H * T * T, T * T, 1, T}; }  // transposed view of a score matrix
  Dims rows() const { return {B, H, T, 1}; }
  Dims row_strides() const { return {H * T, T, 1, 1}; }
};

// keep = row >= col; masked = keep ? scores : -inf (the frontend's top-left causal band).
GraphTensor causal_mask(GraphBuilder& g, const GraphTensor& scores, const GraphTensor& neg_inf) {
  const GraphTensor row = g.virt_like(scores, CUDNN_DATA_INT32);
  g.gen_index(scores, 2, row);  // row = query position
  const GraphTensor col = g.virt_like(scores, CUDNN_DATA_INT32);
  g.gen_index(scores, 3, col);  // col = key position
  const GraphTensor keep = g.virt_like(scores, CUDNN_DATA_BOOLEAN);
  g.binary(CUDNN_POINTWISE_CMP_GE, row, col, keep, CUDNN_DATA_BOOLEAN);  // keep = row >= col
  const GraphTensor masked = g.virt_like(scores);
  g.select(scores, neg_inf, keep, masked);  // masked = keep ? S : -inf
  return masked;
}

void build_forward_graph(GraphBuilder& g, const SdpaShape& s, cudnnDataType_t io) {
  const AttentionDims d(s);
  const GraphTensor q = g.tensor(kUidQ, d.bhtd(), d.qkv_strides(), io);
  const GraphTensor k_t = g.tensor(kUidK, d.bkdt(), d.qkv_t_strides(), io);
  const GraphTensor v = g.tensor(kUidV, d.bktd(), d.qkv_strides(), io);
  const GraphTensor o = g.tensor(kUidO, d.bhtd(), d.out_strides(), io);
  const GraphTensor stats = g.tensor(kUidStats, d.rows(), d.row_strides(), CUDNN_DATA_FLOAT);
  const GraphTensor scale = g.scalar(kUidScale);
  const GraphTensor neg_inf = g.scalar(kUidNegInf);

  const GraphTensor s_raw = g.virt(d.scores(), d.score_strides());
  g.matmul(q, k_t, s_raw);  // S = Q K^T
  const GraphTensor s_scaled = g.virt_like(s_raw);
  g.binary(CUDNN_POINTWISE_MUL, s_raw, scale, s_scaled);  // S = S * scale
  const GraphTensor s_masked = causal_mask(g, s_scaled, neg_inf);
  const GraphTensor row_max = g.virt(d.rows(), d.row_strides());
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, s_masked, row_max);  // m = rowmax(S)
  const GraphTensor centered = g.virt_like(s_raw);
  g.binary(CUDNN_POINTWISE_SUB, s_masked, row_max, centered);  // S - m
  const GraphTensor e = g.virt_like(s_raw);
  g.unary(CUDNN_POINTWISE_EXP, centered, e);  // E = exp(S - m)
  const GraphTensor row_sum = g.virt(d.rows(), d.row_strides());
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, row_sum);  // l = rowsum(E)
  const GraphTensor log_sum = g.virt(d.rows(), d.row_strides());
  g.unary(CUDNN_POINTWISE_LOG, row_sum, log_sum);          // log(l)
  g.binary(CUDNN_POINTWISE_ADD, row_max, log_sum, stats);  // stats = m + log(l)
  const GraphTensor p = g.virt_like(s_raw, io);            // 16-bit: the frontend declares bmm2's A in the I/O type
  g.binary(CUDNN_POINTWISE_DIV, e, row_sum, p);            // P = E / l
  g.matmul(p, v, o);                                       // O = P V
}

// dq_accumulator: the default graph (FP32 dQ accumulator + IDENTITY into dQ; not reproducible).
// Without it: the frontend's "dP workspace" graph, dQ written directly (see "Determinism").
void build_backward_graph(GraphBuilder& g, const SdpaShape& s, cudnnDataType_t io, bool dq_accumulator) {
  const AttentionDims d(s);
  const GraphTensor q = g.tensor(kUidQ, d.bhtd(), d.qkv_strides(), io);
  const GraphTensor k_t = g.tensor(kUidK, d.bkdt(), d.qkv_t_strides(), io);
  const GraphTensor v_t = g.tensor(kUidV, d.bkdt(), d.qkv_t_strides(), io);
  const GraphTensor o = g.tensor(kUidO, d.bhtd(), d.out_strides(), io);
  const GraphTensor d_o = g.tensor(kUidDO, d.bhtd(), d.out_strides(), io);
  const GraphTensor stats = g.tensor(kUidStats, d.rows(), d.row_strides(), CUDNN_DATA_FLOAT);
  const GraphTensor dq = g.tensor(kUidDQ, d.bhtd(), d.qkv_strides(), io);
  const GraphTensor dk = g.tensor(kUidDK, d.bktd(), d.qkv_strides(), io);
  const GraphTensor dv = g.tensor(kUidDV, d.bktd(), d.qkv_strides(), io);
  const GraphTensor scale = g.scalar(kUidScale);
  const GraphTensor neg_inf = g.scalar(kUidNegInf);
  const GraphTensor one = g.scalar(kUidOne);
  const GraphTensor softmax_sum = g.tensor(kUidSoftmaxSum, d.rows(), d.row_strides(), CUDNN_DATA_FLOAT);

  // softmax_sum = rowsum(dO * O) * 1. The virtual product's strides are the frontend's
  // (H*T*D, T*D, H*D, 1), kept as they are although they alias: only the engine's pattern match
  // reads a virtual tensor's strides.
  const GraphTensor do_o = g.virt(d.bhtd(), {d.H * d.T * d.D, d.T * d.D, d.H * d.D, 1});
  g.binary(CUDNN_POINTWISE_MUL, d_o, o, do_o);  // dO * O
  const GraphTensor do_o_sum = g.virt(d.rows(), d.row_strides());
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, do_o, do_o_sum);       // rowsum(dO * O)
  g.binary(CUDNN_POINTWISE_MUL, do_o_sum, one, softmax_sum);  // softmax_sum = ... * 1 (no dropout)

  // P = exp(mask(scale * Q K^T - stats)), recomputed. The frontend subtracts the statistics
  // before masking (the forward masks first): its order is kept so the engines match the graph.
  const GraphTensor s_raw = g.virt(d.scores(), d.score_strides());
  g.matmul(q, k_t, s_raw);  // S = Q K^T
  const GraphTensor s_scaled = g.virt_like(s_raw);
  g.binary(CUDNN_POINTWISE_MUL, s_raw, scale, s_scaled);  // S = S * scale
  const GraphTensor centered = g.virt_like(s_raw);
  g.binary(CUDNN_POINTWISE_SUB, s_scaled, stats, centered);  // S - stats
  const GraphTensor s_masked = causal_mask(g, centered, neg_inf);
  const GraphTensor p = g.virt_like(s_raw);
  g.unary(CUDNN_POINTWISE_EXP, s_masked, p);  // P = exp(masked (S - stats))

  // Grouped K/V heads: a K/V gradient is first computed per query head, then summed over its group.
  const auto grouped_gradient = [&](const GraphTensor& a, const GraphTensor& b, const GraphTensor& out) {
    if (!d.grouped()) {
      g.matmul(a, b, out);
      return;
    }
    const GraphTensor per_head = g.virt(d.bhtd(), d.packed_strides(), io);
    g.matmul(a, b, per_head);
    g.reduction(CUDNN_REDUCE_TENSOR_ADD, per_head, out);  // (B,NH,T,HS) -> (B,KV,T,HS)
  };

  // dV = P^T dO
  const GraphTensor p_t = g.virt(d.scores(), d.score_t_strides(), io);
  g.reshape(p, p_t);                 // P^T, a 16-bit transposed view
  grouped_gradient(p_t, d_o, dv);  // dV = P^T dO

  // dS = P * (dO V^T - softmax_sum) * scale
  const GraphTensor dp = g.virt(d.scores(), d.score_strides());
  g.matmul(d_o, v_t, dp);  // dP = dO V^T
  const GraphTensor dp_centered = g.virt_like(dp);
  g.binary(CUDNN_POINTWISE_SUB, dp, softmax_sum, dp_centered);  // dP - softmax_sum
  const GraphTensor ds_unscaled = g.virt_like(dp);
  g.binary(CUDNN_POINTWISE_MUL, dp_centered, p, ds_unscaled);  // P * (dP - softmax_sum)
  const GraphTensor ds = g.virt_like(dp);
  g.binary(CUDNN_POINTWISE_MUL, ds_unscaled, scale, ds);  // dS = ... * scale

  // dK = dS^T Q
  const GraphTensor ds_t = g.virt(d.scores(), d.score_t_strides(), io);
  g.reshape(ds, ds_t);            // dS^T, a 16-bit transposed view
  grouped_gradient(ds_t, q, dk);  // dK = dS^T Q

  // dQ = dS K. K is K^T viewed back (the frontend leaves this view's type at FP32).
  const GraphTensor k = g.virt(d.bktd(), d.qkv_strides());
  g.reshape(k_t, k);  // K
  if (dq_accumulator) {
    const GraphTensor dq_accum = g.tensor(kUidDQAccum, d.bhtd(), d.packed_strides(), CUDNN_DATA_FLOAT);
    g.matmul(ds, k, dq_accum);                        // dQ_accum = dS K, FP32 (accumulated across key tiles)
    g.unary(CUDNN_POINTWISE_IDENTITY, dq_accum, dq);  // dQ = dQ_accum, converted to 16 bits
  } else {
    g.matmul(ds, k, dq);  // dQ = dS K, written directly
  }
}

std::string numerical_note_name(cudnnBackendNumericalNote_t note) {
  switch (note) {
    case CUDNN_NUMERICAL_NOTE_TENSOR_CORE: return "tensor-core";
    case CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS: return "down-converts-inputs";
    case CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION: return "reduced-precision-reduction";
    case CUDNN_NUMERICAL_NOTE_FFT: return "fft";
    case CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC: return "NONDETERMINISTIC";
    case CUDNN_NUMERICAL_NOTE_STRICT_NAN_PROP: return "strict-nan-propagation";
    default: return "note-" + std::to_string(static_cast<int>(note));
  }
}

// One pass's plan and everything it refers to. Members are destroyed bottom-up: the plan before
// the configuration, the graph and the operations and tensors.
struct PassPlan {
  std::vector<Desc> owned;  // tensors, operations, engine and knob choices of an override
  Desc graph;
  Desc config;
  Desc plan;
  int64_t workspace = 0;  // the plan's own workspace bytes
  int64_t engine = -1;    // cuDNN's global engine index
  std::string source;     // "heuristics A", "heuristics FALLBACK", "engine override"
  std::string notes;      // the engine's numerical notes
  std::string refused;    // configurations tried before it that did not finalize, with their statuses
};

// Best effort: fills engine and notes from the configuration's engine (for plan_summary only).
void describe_engine(cudnnBackendDescriptor_t config, PassPlan* out) {
  Desc engine = create(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  cudnnBackendDescriptor_t raw = engine.get();
  int64_t count = 0;
  if (cudnnBackendGetAttribute(config, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &count, &raw) !=
      CUDNN_STATUS_SUCCESS)
    return;
  int64_t index = -1;
  if (cudnnBackendGetAttribute(raw, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &count, &index) ==
      CUDNN_STATUS_SUCCESS)
    out->engine = index;
  std::array<cudnnBackendNumericalNote_t, CUDNN_NUMERICAL_NOTE_TYPE_COUNT> notes{};
  count = 0;
  if (cudnnBackendGetAttribute(raw, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                               static_cast<int64_t>(notes.size()), &count, notes.data()) != CUDNN_STATUS_SUCCESS)
    return;
  const int64_t n = std::min<int64_t>(count, static_cast<int64_t>(notes.size()));
  for (int64_t i = 0; i < n; ++i) {
    if (!out->notes.empty()) out->notes += ",";
    out->notes += numerical_note_name(notes[static_cast<size_t>(i)]);
  }
}

// Everything cached for one shape.
struct ShapeEntry {
  bool ok = false;
  std::string why;  // when !ok
  PassPlan fwd, bwd;
  // Backward workspace layout, bytes from the caller's workspace pointer.
  size_t softmax_sum_offset = 0;
  size_t dq_accum_offset = 0, dq_accum_bytes = 0;  // dq_accum_bytes 0: no accumulator
  size_t bwd_cudnn_offset = 0;
  size_t bwd_total = 0;
  size_t total = 0;  // max(forward, backward)
};

}  // namespace

std::string describe_sdpa_shape(const SdpaShape& s) {
  return "B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) + " NH=" + std::to_string(s.NH) +
         (s.KV != s.NH ? " KV=" + std::to_string(s.KV) : std::string()) + " HS=" + std::to_string(s.HS) + " " +
         dtype_name(s.type);
}

struct CudnnAttention::Impl {
  struct HandleOwner {
    cudnnHandle_t handle = nullptr;
    HandleOwner() = default;
    HandleOwner(const HandleOwner&) = delete;
    HandleOwner& operator=(const HandleOwner&) = delete;
    ~HandleOwner() {
      if (handle) (void)cudnnDestroy(handle);
    }
  };

  HandleOwner owner;
  cudaStream_t stream = nullptr;
  bool deterministic = false;
  int sm = 0;                    // compute capability as major * 10 + minor, e.g. 90
  int64_t version = 0;           // cuDNN runtime version, e.g. 91900
  float neg_inf = 0.0f;          // the masked score
  bool dq_accumulator = true;    // backward graph variant (false: the deterministic dP-workspace graph)
  int64_t override_engine = -1;  // >= 0: the backward uses this engine with override_knobs
  std::vector<std::pair<cudnnBackendKnobType_t, int64_t>> override_knobs;
  std::string determinism_problem;  // non-empty: no deterministic backward on this GPU / cuDNN
  std::unordered_map<SdpaShape, std::unique_ptr<ShapeEntry>, SdpaShapeHash> cache;

  Impl(cudaStream_t s, bool det) : stream(s), deterministic(det) {
    int device = 0, major = 0, minor = 0;
    PTRAIN_CUDA_CHECK(cudaGetDevice(&device));
    PTRAIN_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    PTRAIN_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    sm = major * 10 + minor;
    version = static_cast<int64_t>(cudnnGetVersion());
    // Older cuDNN preferred the lowest finite float as the masked value (the frontend's choice).
    neg_inf = version < 91000 ? std::numeric_limits<float>::lowest() : -std::numeric_limits<float>::infinity();
    cudnnHandle_t handle = nullptr;
    PTRAIN_CUDNN_CHECK(cudnnCreate(&handle));
    owner.handle = handle;
    PTRAIN_CUDNN_CHECK(cudnnSetStream(owner.handle, stream));
    choose_backward_variant(major);
  }

  // See "Determinism" at the top of the file.
  void choose_backward_variant(int major) {
    if (!deterministic) return;  // the default graph, FP32 dQ accumulator
    dq_accumulator = false;      // the frontend's set_deterministic_algorithm(true): dP-workspace graph
    if (major == 9) return;      // Hopper: that graph is the deterministic kernel, chosen by heuristics
    if (major == 10) {
      if (version < 91800) {
        determinism_problem = "cuDNN " + version_text(version) +
                              " has no deterministic flash-attention backward on Blackwell (sm" + std::to_string(sm) +
                              "); it needs cuDNN 9.18 or newer";
        return;
      }
      override_engine = sm > 103 ? 17 : 5;
      if (version >= 92300)
        override_knobs = {{CUDNN_KNOB_TYPE_TILE_M, 3},     {CUDNN_KNOB_TYPE_TILE_N, 2},
                          {CUDNN_KNOB_TYPE_KERNEL_CFG, 2}, {CUDNN_KNOB_TYPE_STREAM_K, 0},
                          {CUDNN_KNOB_TYPE_TILE_CGA_M, 0}, {CUDNN_KNOB_TYPE_STAGES, 2}};
      else
        override_knobs = {{CUDNN_KNOB_TYPE_KERNEL_CFG, 31}, {CUDNN_KNOB_TYPE_STAGES, 2}};
      return;
    }
    determinism_problem =
        "cuDNN's flash-attention backward is deterministic only on Hopper (sm90) and, from "
        "cuDNN 9.18, data-center Blackwell (sm100/sm103); this GPU is sm" +
        std::to_string(sm);
  }

  cudnnDataType_t io_type(const SdpaShape& s) const {
    return s.type == CUDA_R_16F ? CUDNN_DATA_HALF : CUDNN_DATA_BFLOAT16;
  }

  // Problems known before asking cuDNN; "" if none.
  std::string static_problem(const SdpaShape& s) const {
    if (s.type != CUDA_R_16BF && s.type != CUDA_R_16F)
      return "cuDNN attention runs bf16 or fp16 only, not " + dtype_name(s.type);
    if (s.B <= 0 || s.T <= 0 || s.NH <= 0 || s.KV <= 0 || s.HS <= 0)
      return "empty attention shape " + describe_sdpa_shape(s);
    if (s.NH % s.KV != 0)
      return std::to_string(s.KV) + " K/V heads do not divide " + std::to_string(s.NH) + " query heads";
    // HS % 8 == 0 also makes C and W multiples of 8: the K and V views stay 16-byte aligned.
    if (s.HS % 8 != 0)
      return "head size " + std::to_string(s.HS) + " is not a multiple of 8 (cuDNN flash attention needs it)";
    if (s.T == 1) return "T=1 is not supported by cuDNN's attention backward (s_q = s_kv = 1)";
    if (sm < 80)
      return "cuDNN flash attention needs an sm80 (Ampere) or newer GPU; this one is sm" + std::to_string(sm);
    if (version == 91000 || version == 91001)
      return "cuDNN " + version_text(version) + " has known bugs in bf16/fp16 attention (cudnn-frontend refuses it)";
    // cuDNN 9.15.0 and older can fault (an invalid memory access) in the backward when the key
    // length is not a multiple of 128 and the graph has no padding mask; cudnn-frontend adds one
    // there (CompositeSDPABackwardNode::pre_validate_node, v1.16 to v1.23), and 9.15.1 fixes it.
    // ptrain's graph has no padding mask, so such shapes take the fallback.
    if (version <= 91500 && s.T % 128 != 0)
      return "cuDNN " + version_text(version) + " can fault in the attention backward when the sequence length (" +
             std::to_string(s.T) + ") is not a multiple of 128 (fixed in cuDNN 9.15.1, which this shape needs)";
    if (deterministic && !determinism_problem.empty()) return determinism_problem;
    return "";
  }

  // Engine configurations cuDNN's heuristics propose for `graph`, best first (empty if none).
  std::vector<Desc> heuristic_configs(cudnnBackendDescriptor_t graph, cudnnBackendHeurMode_t mode) {
    Desc heur = create(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    PTRAIN_CUDNN_SET(heur.get(), CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph);
    PTRAIN_CUDNN_SET(heur.get(), CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    const cudnnStatus_t status = cudnnBackendFinalize(heur.get());
    if (is_not_supported(status)) return {};
    check(status, "cudnnBackendFinalize(engine heuristics)", __LINE__);
    int64_t count = 0;
    PTRAIN_CUDNN_CHECK(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr));
    std::vector<Desc> configs;
    if (count <= 0) return configs;
    std::vector<cudnnBackendDescriptor_t> raw;
    for (int64_t i = 0; i < count; ++i) {
      configs.push_back(create(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
      raw.push_back(configs.back().get());
    }
    int64_t returned = 0;
    PTRAIN_CUDNN_CHECK(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &returned, raw.data()));
    configs.resize(static_cast<size_t>(std::max<int64_t>(0, std::min(returned, count))));
    return configs;
  }

  // The fixed engine and knobs of the Blackwell deterministic backward (the frontend's
  // override_heuristics_query). The engine and knob descriptors are kept in out->owned.
  Desc override_config(cudnnBackendDescriptor_t graph, PassPlan* out) {
    Desc engine = create(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
    PTRAIN_CUDNN_SET(engine.get(), CUDNN_ATTR_ENGINE_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph);
    PTRAIN_CUDNN_SET(engine.get(), CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &override_engine);
    PTRAIN_CUDNN_FINALIZE(engine.get(), "engine (deterministic override)");
    std::vector<cudnnBackendDescriptor_t> choices;
    for (const auto& [type, value] : override_knobs) {
      Desc choice = create(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR);
      PTRAIN_CUDNN_SET(choice.get(), CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_TYPE_KNOB_TYPE, 1, &type);
      PTRAIN_CUDNN_SET(choice.get(), CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, CUDNN_TYPE_INT64, 1, &value);
      PTRAIN_CUDNN_FINALIZE(choice.get(), "knob choice");
      choices.push_back(choice.get());
      out->owned.push_back(std::move(choice));
    }
    Desc config = create(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    const cudnnBackendDescriptor_t engine_raw = engine.get();
    PTRAIN_CUDNN_SET(config.get(), CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &engine_raw);
    PTRAIN_CUDNN_SET(config.get(), CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, CUDNN_TYPE_BACKEND_DESCRIPTOR, choices.size(),
                     choices.data());
    PTRAIN_CUDNN_FINALIZE(config.get(), "engine configuration (deterministic override)");
    out->owned.push_back(std::move(engine));
    return config;
  }

  // Builds one pass's graph and plan. false with *why when no engine configuration finalizes.
  // NOT_SUPPORTED statuses from the graph itself throw CudaError (build() turns them into reasons);
  // NOT_SUPPORTED from one configuration only skips it.
  bool build_pass(bool backward, const SdpaShape& s, PassPlan* out, std::string* why) {
    const char* pass = backward ? "backward" : "forward";
    GraphBuilder g(version);
    if (backward)
      build_backward_graph(g, s, io_type(s), dq_accumulator);
    else
      build_forward_graph(g, s, io_type(s));
    out->graph = g.finalize(owner.handle);
    out->owned = g.take_owned();

    int tried = 0;
    std::string skipped;  // "engine 3: CUDNN_STATUS_NOT_SUPPORTED_SHAPE (...)"
    cudnnStatus_t hard_status = CUDNN_STATUS_SUCCESS;
    std::string hard_what;
    auto try_configs = [&](std::vector<Desc> configs, const std::string& source) {
      for (Desc& config : configs) {
        ++tried;
        Desc plan = create(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
        const cudnnBackendDescriptor_t config_raw = config.get();
        PTRAIN_CUDNN_SET(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                         &config_raw);
        PassPlan info;
        describe_engine(config_raw, &info);
        const cudnnStatus_t status = cudnnBackendFinalize(plan.get());
        if (status != CUDNN_STATUS_SUCCESS) {
          const std::string text = status_text(status);
          if (skipped.size() < 600)
            skipped +=
                (skipped.empty() ? "" : "; ") + std::string("engine ") + std::to_string(info.engine) + ": " + text;
          if (!is_not_supported(status) && hard_status == CUDNN_STATUS_SUCCESS) {
            hard_status = status;
            hard_what = std::string("cudnnBackendFinalize(") + pass + " execution plan, engine " +
                        std::to_string(info.engine) + ", " + source + ")";
          }
          continue;
        }
        int64_t workspace = 0, count = 0;
        PTRAIN_CUDNN_CHECK(cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                                    CUDNN_TYPE_INT64, 1, &count, &workspace));
        out->config = std::move(config);
        out->plan = std::move(plan);
        out->workspace = std::max<int64_t>(0, workspace);
        out->engine = info.engine;
        out->notes = info.notes;
        out->source = source;
        out->refused = skipped;
        return true;
      }
      return false;
    };

    bool found = false;
    if (backward && override_engine >= 0) {
      std::vector<Desc> configs;
      configs.push_back(override_config(out->graph.get(), out));
      found = try_configs(std::move(configs), "engine override " + std::to_string(override_engine));
    } else {
      found = try_configs(heuristic_configs(out->graph.get(), CUDNN_HEUR_MODE_A), "heuristics A") ||
              try_configs(heuristic_configs(out->graph.get(), CUDNN_HEUR_MODE_FALLBACK), "heuristics FALLBACK");
    }
    if (found) return true;
    // A configuration failed for another reason than "not supported": a real failure.
    if (hard_status != CUDNN_STATUS_SUCCESS)
      throw_cudnn_error(static_cast<int>(hard_status), hard_what.c_str(), __FILE__, __LINE__);
    *why = std::string("cuDNN found no engine for the ") + pass + " graph of " + describe_sdpa_shape(s) +
           (backward && !dq_accumulator ? " (deterministic)" : "") +
           (tried == 0 ? std::string(": the heuristics proposed no engine configuration")
                       : ": " + std::to_string(tried) + " engine configuration(s) refused: " + skipped);
    return false;
  }

  std::unique_ptr<ShapeEntry> build(const SdpaShape& s) {
    auto e = std::make_unique<ShapeEntry>();
    e->why = static_problem(s);
    if (!e->why.empty()) return e;
    PassPlan fwd, bwd;
    const char* pass = "forward";
    try {
      if (!build_pass(false, s, &fwd, &e->why)) return e;
      pass = "backward";
      if (!build_pass(true, s, &bwd, &e->why)) return e;
    } catch (const CudaError& err) {
      if (err.library() != "cuDNN" || !is_not_supported(err.status())) throw;
      e->why = std::string("cuDNN does not support the ") + pass + " attention graph of " + describe_sdpa_shape(s) +
               ": " + err.what();
      return e;
    }
    e->fwd = std::move(fwd);
    e->bwd = std::move(bwd);
    const size_t rows = static_cast<size_t>(s.B * s.NH * s.T);
    size_t offset = 0;
    e->softmax_sum_offset = offset;
    offset += align_up(rows * sizeof(float));
    if (dq_accumulator) {
      e->dq_accum_offset = offset;
      e->dq_accum_bytes = rows * static_cast<size_t>(s.HS) * sizeof(float);
      offset += align_up(e->dq_accum_bytes);
    }
    e->bwd_cudnn_offset = offset;
    e->bwd_total = offset + static_cast<size_t>(e->bwd.workspace);
    e->total = std::max(static_cast<size_t>(e->fwd.workspace), e->bwd_total);
    e->ok = true;
    return e;
  }

  ShapeEntry& entry(const SdpaShape& s) {
    auto it = cache.find(s);
    if (it == cache.end()) {
      it = cache.emplace(s, build(s)).first;
      if (library_log_enabled()) log_entry(s, *it->second);
    }
    return *it->second;
  }

  // The PTRAIN_LIBRARY_LOG record of one shape: the engines cuDNN gave each pass, or why none.
  void log_entry(const SdpaShape& s, const ShapeEntry& e) const {
    auto pass = [](const PassPlan& p) {
      return nlohmann::json{{"engine", p.engine},     {"source", p.source},       {"notes", p.notes},
                            {"workspace", p.workspace}, {"refused_before", p.refused}};
    };
    nlohmann::json record = {{"library", "cuDNN"},
                             {"version", version},
                             {"sm", sm},
                             {"shape", {{"B", s.B}, {"T", s.T}, {"NH", s.NH}, {"KV", s.KV}, {"HS", s.HS}}},
                             {"type", s.type == CUDA_R_16BF ? "bf16" : "fp16"},
                             {"graph", dq_accumulator ? "dQ-accumulator backward" : "dP-workspace backward"},
                             {"ok", e.ok}};
    if (e.ok) {
      record["forward"] = pass(e.fwd);
      record["backward"] = pass(e.bwd);
    } else {
      record["why"] = e.why;
    }
    log_library_choice(record);
  }

  // The entry of a shape forward()/backward() can run; EnvironmentError otherwise.
  ShapeEntry& usable(const SdpaShape& s) {
    ShapeEntry& e = entry(s);
    if (!e.ok) throw EnvironmentError("cuDNN attention cannot run " + describe_sdpa_shape(s) + ": " + e.why);
    return e;
  }

  void execute(const PassPlan& p, const int64_t* uids, void* const* pointers, size_t n, void* workspace) {
    Desc pack = create(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    PTRAIN_CUDNN_SET(pack.get(), CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids);
    PTRAIN_CUDNN_SET(pack.get(), CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, pointers);
    PTRAIN_CUDNN_SET(pack.get(), CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
    PTRAIN_CUDNN_FINALIZE(pack.get(), "variant pack");
    PTRAIN_CUDNN_CHECK(cudnnBackendExecute(owner.handle, p.plan.get(), pack.get()));
  }
};

CudnnAttention::CudnnAttention(cudaStream_t stream, bool deterministic)
    : impl_(std::make_unique<Impl>(stream, deterministic)) {}

CudnnAttention::~CudnnAttention() = default;

bool CudnnAttention::supported(const SdpaShape& s, std::string* why) {
  const ShapeEntry& e = impl_->entry(s);
  if (!e.ok && why) *why = e.why;
  return e.ok;
}

size_t CudnnAttention::workspace_bytes(const SdpaShape& s) { return impl_->usable(s).total; }

void CudnnAttention::forward(const SdpaShape& s, void* out, float* stats, const void* qkv, float scale,
                             void* workspace) {
  const ShapeEntry& e = impl_->usable(s);
  PTRAIN_CHECK(aligned(qkv, 16) && aligned(out, 16) && aligned(stats, 16),
               "cuDNN attention forward: qkv, out and stats must be 16-byte aligned");
  PTRAIN_CHECK(e.fwd.workspace == 0 || (workspace && aligned(workspace, 16)),
               "cuDNN attention forward: missing or misaligned workspace");
  char* base = static_cast<char*>(const_cast<void*>(qkv));  // cuDNN's variant pack takes void*
  const size_t k_offset = static_cast<size_t>(s.NH * s.HS) * kElementBytes;
  const size_t v_offset = k_offset + static_cast<size_t>(s.KV * s.HS) * kElementBytes;
  float scale_value = scale;  // by-value scalars: host pointers, read when the kernels launch
  float neg_inf = impl_->neg_inf;
  const std::array<int64_t, 7> uids = {kUidQ, kUidK, kUidV, kUidO, kUidStats, kUidScale, kUidNegInf};
  const std::array<void*, 7> pointers = {base, base + k_offset, base + v_offset, out, stats, &scale_value, &neg_inf};
  impl_->execute(e.fwd, uids.data(), pointers.data(), uids.size(), workspace);
}

void CudnnAttention::backward(const SdpaShape& s, void* dqkv, const void* dout, const void* qkv, const void* out,
                              const float* stats, float scale, void* workspace) {
  const ShapeEntry& e = impl_->usable(s);
  PTRAIN_CHECK(aligned(dqkv, 16) && aligned(dout, 16) && aligned(qkv, 16) && aligned(out, 16) && aligned(stats, 16),
               "cuDNN attention backward: dqkv, dout, qkv, out and stats must be 16-byte aligned");
  PTRAIN_CHECK(workspace && aligned(workspace, 16), "cuDNN attention backward: missing or misaligned workspace");
  char* base = static_cast<char*>(const_cast<void*>(qkv));
  char* dbase = static_cast<char*>(dqkv);
  char* ws = static_cast<char*>(workspace);
  const size_t k_offset = static_cast<size_t>(s.NH * s.HS) * kElementBytes;
  const size_t v_offset = k_offset + static_cast<size_t>(s.KV * s.HS) * kElementBytes;
  void* softmax_sum = ws + e.softmax_sum_offset;
  void* dq_accum = e.dq_accum_bytes ? ws + e.dq_accum_offset : nullptr;
  // cuDNN >= 9.6 initialises the accumulator itself; the frontend memsets it for older versions.
  if (dq_accum && impl_->version < 90600)
    PTRAIN_CUDA_CHECK(cudaMemsetAsync(dq_accum, 0, e.dq_accum_bytes, impl_->stream));
  float scale_value = scale;
  float neg_inf = impl_->neg_inf;
  float one = 1.0f;
  std::array<int64_t, 14> uids = {kUidQ,  kUidK,  kUidV,     kUidO,      kUidDO,  kUidStats,      kUidDQ,
                                  kUidDK, kUidDV, kUidScale, kUidNegInf, kUidOne, kUidSoftmaxSum, kUidDQAccum};
  std::array<void*, 14> pointers = {base,
                                    base + k_offset,
                                    base + v_offset,
                                    const_cast<void*>(out),
                                    const_cast<void*>(dout),
                                    const_cast<float*>(stats),
                                    dbase,
                                    dbase + k_offset,
                                    dbase + v_offset,
                                    &scale_value,
                                    &neg_inf,
                                    &one,
                                    softmax_sum,
                                    dq_accum};
  const size_t n = dq_accum ? 14 : 13;  // the accumulator is the last entry; only its graph has it
  impl_->execute(e.bwd, uids.data(), pointers.data(), n, ws + e.bwd_cudnn_offset);
}

std::string CudnnAttention::plan_summary(const SdpaShape& s) {
  const ShapeEntry& e = impl_->entry(s);
  if (!e.ok) return "unsupported: " + e.why;
  auto pass = [](const char* name, const PassPlan& p) {
    return std::string(name) + ": engine " + std::to_string(p.engine) + " (" + p.source + ")" +
           (p.notes.empty() ? std::string() : ", notes " + p.notes) + ", plan workspace " +
           std::to_string(p.workspace) + " B";
  };
  std::string text =
      "cuDNN " + version_text(impl_->version) + " sm" + std::to_string(impl_->sm) + " " + describe_sdpa_shape(s) +
      "; " + pass("forward", e.fwd) + "; " + pass("backward", e.bwd) +
      (e.dq_accum_bytes ? ", FP32 dQ-accumulator graph (nondeterministic)" : ", dP-workspace graph (deterministic)") +
      "; total workspace " + std::to_string(e.total) + " B";
  return text;
}

#undef PTRAIN_CUDNN_SET
#undef PTRAIN_CUDNN_FINALIZE

}  // namespace ptrain

#endif  // PTRAIN_HAVE_CUDA
