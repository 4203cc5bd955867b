// The simulated cuDNN (see sim.h): the backend API's descriptors that ptrain's attention builds
// (tensor, matmul, pointwise, reduction and reshape operations, operation graph, engine
// heuristics, engine configuration, engine, execution plan, variant pack), each attribute checked
// against the type cudnn_graph.h and the backend API reference give it and each descriptor's
// required attributes checked at finalize; and an interpreter that executes an operation graph of
// those operations on the stream of the handle.
//
// Semantics (cuDNN Backend API reference, "Operations": CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR,
// _POINTWISE_, _REDUCTION_, _RESHAPE_): tensors are up to 8-D with explicit strides; a pointwise
// input broadcasts along every dimension where its extent is 1 (a lower-rank input aligns to the
// output's last dimensions, as cudnn-frontend's rank-1 scalars do); a reduction reduces the
// dimensions where the output's extent is 1, and groups of consecutive indices where it divides
// the input's (output index c / g collects input indices c, g = input / output extent); a matmul
// multiplies the last two dimensions, batched over the others, where an operand's batch extent
// that divides the output's is broadcast by the same groups (output batch index c reads operand
// index c / g: grouped-query attention's K/V heads, as cudnn-frontend's GQA lowering uses them;
// extent 1 is the plain broadcast); a reshape presents the same memory with the output's dims and strides.
// Real (non-virtual) tensors are read and written through their strides from the variant pack's
// pointers; virtual tensors live in the plan's workspace, densely, in their declared data type
// (a 16-bit virtual rounds as the engine's would); by-value scalars are read when
// cudnnBackendExecute is called. The plan's workspace is the virtual tensors' bytes, so a
// workspace the caller under-sizes is overrun.
//
// Engines: one, the interpreter, for every graph, except that an attention (SDPA) graph outside
// the support surface of real cuDNN's fused flash-attention engines gets no execution plan (a
// NOT_SUPPORTED status with the reason; "support surface" below).
#include <cudnn.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "sim.h"

namespace {

thread_local std::string last_error;

cudnnStatus_t bad(const std::string& why, cudnnStatus_t status = CUDNN_STATUS_BAD_PARAM) {
  last_error = why;
  return status;
}

size_t attribute_type_size(cudnnBackendAttributeType_t t) {
  switch (t) {
    case CUDNN_TYPE_BOOLEAN: return sizeof(bool);
    case CUDNN_TYPE_INT64: return 8;
    case CUDNN_TYPE_FLOAT: return 4;
    case CUDNN_TYPE_DOUBLE: return 8;
    case CUDNN_TYPE_HANDLE:
    case CUDNN_TYPE_VOID_PTR:
    case CUDNN_TYPE_BACKEND_DESCRIPTOR: return sizeof(void*);
    default: return 4;  // the enumerations
  }
}

// The attributes each descriptor type takes and their types (cudnn_graph.h; Backend API reference,
// one section per descriptor type).
const std::map<cudnnBackendDescriptorType_t, std::map<cudnnBackendAttributeName_t, cudnnBackendAttributeType_t>>&
schema() {
  static const std::map<cudnnBackendDescriptorType_t, std::map<cudnnBackendAttributeName_t, cudnnBackendAttributeType_t>>
      s = {
          {CUDNN_BACKEND_TENSOR_DESCRIPTOR,
           {{CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE},
            {CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64},
            {CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64},
            {CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64},
            {CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64},
            {CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN},
            {CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN}}},
          {CUDNN_BACKEND_MATMUL_DESCRIPTOR, {{CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE}}},
          {CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR,
           {{CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR},
            {CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR},
            {CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR},
            {CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR}}},
          {CUDNN_BACKEND_POINTWISE_DESCRIPTOR,
           {{CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE},
            {CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE},
            {CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64}}},
          {CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR,
           {{CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR},
            {CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR},
            {CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR},
            {CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR},
            {CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR},
            {CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT},
            {CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT}}},
          {CUDNN_BACKEND_REDUCTION_DESCRIPTOR,
           {{CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE},
            {CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE},
            {CUDNN_ATTR_REDUCTION_IS_DETERMINISTIC, CUDNN_TYPE_BOOLEAN}}},
          {CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR,
           {{CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR},
            {CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR},
            {CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR}}},
          {CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR,
           {{CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR},
            {CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR}}},
          {CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR,
           {{CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE},
            {CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR}}},
          {CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR,
           {{CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR},
            {CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE},
            {CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR}}},
          {CUDNN_BACKEND_ENGINECFG_DESCRIPTOR,
           {{CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR},
            {CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, CUDNN_TYPE_BACKEND_DESCRIPTOR}}},
          {CUDNN_BACKEND_ENGINE_DESCRIPTOR,
           {{CUDNN_ATTR_ENGINE_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR},
            {CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64},
            {CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE}}},
          {CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR,
           {{CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE},
            {CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR},
            {CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64}}},
          {CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR,
           {{CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64},
            {CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR},
            {CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR}}},
      };
  return s;
}

struct Descriptor;

// A finalized tensor.
struct TensorInfo {
  int64_t uid = 0;
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  std::vector<int64_t> dims, strides;
  bool is_virtual = false, by_value = false;
  int64_t alignment = 0;  // bytes the real tensor's pointer is promised to be aligned to
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    return n;
  }
};

struct Operation {
  cudnnBackendDescriptorType_t kind{};
  cudnnPointwiseMode_t mode{};  // pointwise
  int64_t axis = -1;            // GEN_INDEX
  float alpha1 = 1, alpha2 = 1;
  cudnnReduceTensorOp_t reduce{};  // reduction
  std::vector<const Descriptor*> inputs;  // matmul: A, B; pointwise: X [, B [, T]]; reduction, reshape: X
  const Descriptor* output = nullptr;
};

struct Descriptor {
  cudnnBackendDescriptorType_t type;
  bool finalized = false;
  std::map<cudnnBackendAttributeName_t, std::vector<unsigned char>> attrs;  // raw values as set
  // Filled at finalize:
  TensorInfo tensor;
  Operation op;
  std::vector<const Descriptor*> ops;  // operation graph
  const Descriptor* graph = nullptr;   // heuristics, engine, plan: the operation graph
  int64_t workspace = 0;               // plan
  cudaStream_t stream = nullptr;       // plan: the handle's stream at finalize
  std::vector<int64_t> uids;           // variant pack
  std::vector<void*> pointers;
  void* workspace_ptr = nullptr;
  std::shared_ptr<Descriptor> engine_storage;  // an engine configuration's engine, made by the heuristics

  template <typename T>
  std::vector<T> values(cudnnBackendAttributeName_t name) const {
    std::vector<T> out;
    auto it = attrs.find(name);
    if (it == attrs.end()) return out;
    out.resize(it->second.size() / sizeof(T));
    std::memcpy(out.data(), it->second.data(), out.size() * sizeof(T));
    return out;
  }
  template <typename T>
  bool one(cudnnBackendAttributeName_t name, T* value) const {
    const std::vector<T> v = values<T>(name);
    if (v.size() != 1) return false;
    *value = v[0];
    return true;
  }
  const Descriptor* child(cudnnBackendAttributeName_t name) const {
    Descriptor* d = nullptr;
    return one(name, &d) ? d : nullptr;
  }
};

struct Handle {
  cudaStream_t stream = nullptr;
  int device = 0;  // current at cudnnCreate: the GPU whose engines the handle's plans use
};

size_t element_size(cudnnDataType_t t) {
  switch (t) {
    case CUDNN_DATA_FLOAT:
    case CUDNN_DATA_INT32: return 4;
    case CUDNN_DATA_HALF:
    case CUDNN_DATA_BFLOAT16: return 2;
    case CUDNN_DATA_BOOLEAN: return 1;
    default: return 0;
  }
}

float load(const void* p, int64_t i, cudnnDataType_t t) {
  switch (t) {
    case CUDNN_DATA_FLOAT: return static_cast<const float*>(p)[i];
    case CUDNN_DATA_HALF: return __half2float(static_cast<const __half*>(p)[i]);
    case CUDNN_DATA_BFLOAT16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case CUDNN_DATA_INT32: return float(static_cast<const int32_t*>(p)[i]);
    case CUDNN_DATA_BOOLEAN: return static_cast<const uint8_t*>(p)[i] ? 1.0f : 0.0f;
    default: return NAN;
  }
}

void store(void* p, int64_t i, cudnnDataType_t t, float v) {
  switch (t) {
    case CUDNN_DATA_FLOAT: static_cast<float*>(p)[i] = v; break;
    case CUDNN_DATA_HALF: static_cast<__half*>(p)[i] = __float2half_rn(v); break;
    case CUDNN_DATA_BFLOAT16: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v); break;
    case CUDNN_DATA_INT32: static_cast<int32_t*>(p)[i] = int32_t(v); break;
    case CUDNN_DATA_BOOLEAN: static_cast<uint8_t*>(p)[i] = v != 0.0f; break;
    default: break;
  }
}

// ---------------------------------------------------------------------------- finalize

cudnnStatus_t finalize_tensor(Descriptor& d) {
  TensorInfo& t = d.tensor;
  if (!d.one(CUDNN_ATTR_TENSOR_DATA_TYPE, &t.type) || !d.one(CUDNN_ATTR_TENSOR_UNIQUE_ID, &t.uid))
    return bad("tensor: DATA_TYPE and UNIQUE_ID are required");
  if (!d.one(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, &t.alignment) || t.alignment <= 0)
    return bad("tensor: BYTE_ALIGNMENT is required");
  t.dims = d.values<int64_t>(CUDNN_ATTR_TENSOR_DIMENSIONS);
  t.strides = d.values<int64_t>(CUDNN_ATTR_TENSOR_STRIDES);
  if (t.dims.empty() || t.dims.size() > 8 || t.dims.size() != t.strides.size())
    return bad("tensor: DIMENSIONS and STRIDES need the same count, 1 to 8");
  for (size_t i = 0; i < t.dims.size(); ++i)
    if (t.dims[i] <= 0 || t.strides[i] <= 0) return bad("tensor: dimensions and strides must be positive");
  if (element_size(t.type) == 0) return bad("tensor: a data type the simulation does not model");
  uint8_t flag = 0;  // CUDNN_TYPE_BOOLEAN is a C++ bool: one byte
  t.is_virtual = d.one(CUDNN_ATTR_TENSOR_IS_VIRTUAL, &flag) && flag;
  flag = 0;
  t.by_value = d.one(CUDNN_ATTR_TENSOR_IS_BY_VALUE, &flag) && flag;
  if (t.is_virtual && t.by_value) return bad("tensor: virtual and by value");
  return CUDNN_STATUS_SUCCESS;
}

const TensorInfo* tensor_of(const Descriptor* d) {
  return d && d->type == CUDNN_BACKEND_TENSOR_DESCRIPTOR && d->finalized ? &d->tensor : nullptr;
}

// x broadcasts to y: aligned to y's last dimensions, each extent equal or 1.
bool broadcasts(const TensorInfo& x, const TensorInfo& y) {
  if (x.dims.size() > y.dims.size()) return false;
  const size_t shift = y.dims.size() - x.dims.size();
  for (size_t i = 0; i < x.dims.size(); ++i)
    if (x.dims[i] != 1 && x.dims[i] != y.dims[i + shift]) return false;
  return true;
}

cudnnStatus_t finalize_operation(Descriptor& d) {
  Operation& op = d.op;
  op.kind = d.type;
  auto need = [&](cudnnBackendAttributeName_t name) -> const Descriptor* {
    const Descriptor* c = d.child(name);
    return tensor_of(c) ? c : nullptr;
  };
  switch (d.type) {
    case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR: {
      const Descriptor *a = need(CUDNN_ATTR_OPERATION_MATMUL_ADESC), *b = need(CUDNN_ATTR_OPERATION_MATMUL_BDESC),
                       *c = need(CUDNN_ATTR_OPERATION_MATMUL_CDESC);
      const Descriptor* mm = d.child(CUDNN_ATTR_OPERATION_MATMUL_DESC);
      if (!a || !b || !c || !mm || !mm->finalized) return bad("matmul: ADESC, BDESC, CDESC and DESC are required");
      const auto &ta = a->tensor, &tb = b->tensor, &tc = c->tensor;
      const size_t r = tc.dims.size();
      if (r < 2 || ta.dims.size() != r || tb.dims.size() != r) return bad("matmul: A, B and C need the same rank");
      if (ta.dims[r - 1] != tb.dims[r - 2] || ta.dims[r - 2] != tc.dims[r - 2] || tb.dims[r - 1] != tc.dims[r - 1])
        return bad("matmul: A (M,K) x B (K,N) -> C (M,N) do not agree");
      for (size_t i = 0; i + 2 < r; ++i)
        if (ta.dims[i] <= 0 || tb.dims[i] <= 0 || tc.dims[i] % ta.dims[i] != 0 || tc.dims[i] % tb.dims[i] != 0)
          return bad("matmul: batch dimensions do not agree (an operand's extent must divide C's)");
      op.inputs = {a, b};
      op.output = c;
      return CUDNN_STATUS_SUCCESS;
    }
    case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR: {
      const Descriptor* pw = d.child(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR);
      const Descriptor *x = need(CUDNN_ATTR_OPERATION_POINTWISE_XDESC), *y = need(CUDNN_ATTR_OPERATION_POINTWISE_YDESC);
      if (!pw || !pw->finalized || !x || !y) return bad("pointwise: PW_DESCRIPTOR, XDESC and YDESC are required");
      if (!pw->one(CUDNN_ATTR_POINTWISE_MODE, &op.mode)) return bad("pointwise: MODE is required");
      pw->one(CUDNN_ATTR_POINTWISE_AXIS, &op.axis);
      d.one(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, &op.alpha1);
      d.one(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, &op.alpha2);
      op.inputs = {x};
      const bool binary = op.mode == CUDNN_POINTWISE_ADD || op.mode == CUDNN_POINTWISE_SUB ||
                          op.mode == CUDNN_POINTWISE_MUL || op.mode == CUDNN_POINTWISE_DIV ||
                          op.mode == CUDNN_POINTWISE_CMP_GE || op.mode == CUDNN_POINTWISE_BINARY_SELECT;
      const bool unary = op.mode == CUDNN_POINTWISE_EXP || op.mode == CUDNN_POINTWISE_LOG ||
                         op.mode == CUDNN_POINTWISE_IDENTITY || op.mode == CUDNN_POINTWISE_GEN_INDEX;
      if (!binary && !unary) return bad("pointwise: a mode the simulation does not model", CUDNN_STATUS_NOT_SUPPORTED);
      if (binary) {
        const Descriptor* b = need(CUDNN_ATTR_OPERATION_POINTWISE_BDESC);
        if (!b) return bad("pointwise: a binary mode needs BDESC");
        op.inputs.push_back(b);
      }
      if (op.mode == CUDNN_POINTWISE_BINARY_SELECT) {
        const Descriptor* t = need(CUDNN_ATTR_OPERATION_POINTWISE_TDESC);
        if (!t) return bad("pointwise: BINARY_SELECT needs TDESC");
        op.inputs.push_back(t);
      }
      if (op.mode == CUDNN_POINTWISE_GEN_INDEX && (op.axis < 0 || op.axis >= int64_t(y->tensor.dims.size())))
        return bad("pointwise: GEN_INDEX needs an AXIS within the output's rank");
      for (const Descriptor* in : op.inputs)
        if (!broadcasts(in->tensor, y->tensor)) return bad("pointwise: an input does not broadcast to the output");
      op.output = y;
      return CUDNN_STATUS_SUCCESS;
    }
    case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR: {
      const Descriptor* red = d.child(CUDNN_ATTR_OPERATION_REDUCTION_DESC);
      const Descriptor *x = need(CUDNN_ATTR_OPERATION_REDUCTION_XDESC), *y = need(CUDNN_ATTR_OPERATION_REDUCTION_YDESC);
      if (!red || !red->finalized || !x || !y) return bad("reduction: DESC, XDESC and YDESC are required");
      if (!red->one(CUDNN_ATTR_REDUCTION_OPERATOR, &op.reduce)) return bad("reduction: OPERATOR is required");
      if (op.reduce != CUDNN_REDUCE_TENSOR_ADD && op.reduce != CUDNN_REDUCE_TENSOR_MAX)
        return bad("reduction: an operator the simulation does not model", CUDNN_STATUS_NOT_SUPPORTED);
      if (x->tensor.dims.size() != y->tensor.dims.size()) return bad("reduction: X and Y need the same rank");
      for (size_t i = 0; i < y->tensor.dims.size(); ++i)
        if (y->tensor.dims[i] <= 0 || x->tensor.dims[i] % y->tensor.dims[i] != 0)
          return bad("reduction: Y's extents must divide X's");
      op.inputs = {x};
      op.output = y;
      return CUDNN_STATUS_SUCCESS;
    }
    case CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR: {
      const Descriptor *x = need(CUDNN_ATTR_OPERATION_RESHAPE_XDESC), *y = need(CUDNN_ATTR_OPERATION_RESHAPE_YDESC);
      if (!x || !y) return bad("reshape: XDESC and YDESC are required");
      if (x->tensor.numel() != y->tensor.numel()) return bad("reshape: X and Y differ in element count");
      op.inputs = {x};
      op.output = y;
      return CUDNN_STATUS_SUCCESS;
    }
    default: return CUDNN_STATUS_SUCCESS;
  }
}

bool is_operation(cudnnBackendDescriptorType_t t) {
  return t == CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR || t == CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR ||
         t == CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR || t == CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR;
}

int64_t align256(int64_t b) { return (b + 255) / 256 * 256; }

cudnnStatus_t finalize_graph(Descriptor& d) {
  for (Descriptor* op : d.values<Descriptor*>(CUDNN_ATTR_OPERATIONGRAPH_OPS)) {
    if (!op || !is_operation(op->type) || !op->finalized) return bad("operation graph: OPS must be finalized operations");
    d.ops.push_back(op);
  }
  if (d.ops.empty()) return bad("operation graph: OPS is required");
  // Each virtual tensor is produced once, before (in some order) anything reads it; each uid
  // names one tensor.
  std::map<int64_t, const TensorInfo*> by_uid;
  std::map<int64_t, int> produced;
  for (const Descriptor* op : d.ops) {
    std::vector<const Descriptor*> all = op->op.inputs;
    all.push_back(op->op.output);
    for (const Descriptor* t : all) {
      auto [it, fresh] = by_uid.emplace(t->tensor.uid, &t->tensor);
      if (!fresh && it->second != &t->tensor) return bad("operation graph: two tensors share uid " + std::to_string(t->tensor.uid));
    }
    ++produced[op->op.output->tensor.uid];
  }
  for (const auto& [uid, t] : by_uid) {
    if (t->is_virtual && produced[uid] != 1)
      return bad("operation graph: virtual tensor " + std::to_string(uid) + " is produced " +
                 std::to_string(produced[uid]) + " times");
    if (t->by_value && produced[uid] != 0) return bad("operation graph: a by-value tensor is written");
  }
  return CUDNN_STATUS_SUCCESS;
}

// ---------------------------------------------------------------------------- support surface
//
// Real cuDNN runs scaled-dot-product attention only on its fused flash-attention engines: its
// runtime-fusion engines match the composite graph cudnn-frontend lowers sdpa()/sdpa_backward()
// to (ptrain's cudnn_attention.cpp builds the same one) and impose their support surface. A graph
// of that pattern outside it has no engine, and ptrain must fall back rather than pass CI on a
// graph no GPU would run. Where exactly cuDNN says so is not public; the simulation refuses the
// execution plan's finalize with a NOT_SUPPORTED status and the reason as the last error string,
// the answer ptrain's engine loop reads as "this engine does not take the graph".
//
// The pattern is recognised by its structure, not by uids (those are the caller's choice):
//  - the score matmul S = Q K^T: both operands real tensors, and an EXP computed from S (the
//    softmax's, forward; P = exp(S - stats), backward);
//  - backward: a second matmul of two real operands from which no EXP is computed, dP = dO V^T;
//    forward: a matmul computed from S with a real B operand, O = P V;
//  - the row statistics: in the forward, the graph's results (written, read by no operation)
//    other than O whose last extent is 1; in the backward, the real tensors read on the way from
//    S to its EXP; the backward's O: the real tensor multiplied pointwise with dO (softmax_sum's
//    rowsum(dO * O)); its dQ, dK, dV: the graph's results. Real tensors that are written and read
//    again (softmax_sum, the FP32 dQ accumulator) are workspace, not checked.
// A graph without this pattern (no such matmuls) is not attention, and is accepted as before.
// Sources, cited rule by rule below: cudnn-frontend v1.23.0 (fb682ce)
// include/cudnn_frontend/node/sdpa_support_surface.h (SDPA_attributes::validate_sdpa_support_surface,
// the forward's checks) and node/scaled_dot_product_flash_attention.h
// (CompositeSDPABackwardNode::pre_validate_node); the frontend's Attention support matrix
// (docs.nvidia.com/deeplearning/cudnn/frontend/latest/operations/Attention.html, cuDNN 9.18.1).

bool is_real(const TensorInfo& t) { return !t.is_virtual && !t.by_value; }

bool is_pointwise(const Descriptor* op, cudnnPointwiseMode_t mode) {
  return op->op.kind == CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR && op->op.mode == mode;
}

// The operations that read tensor `uid` or anything computed from it. follow_exp false: an EXP
// is listed but what it computes is not followed.
std::vector<const Descriptor*> downstream(const Descriptor& graph, int64_t uid, bool follow_exp) {
  std::vector<const Descriptor*> found;
  std::vector<int64_t> frontier = {uid};
  while (!frontier.empty()) {
    const int64_t t = frontier.back();
    frontier.pop_back();
    for (const Descriptor* op : graph.ops) {
      if (std::find(found.begin(), found.end(), op) != found.end()) continue;
      const auto& in = op->op.inputs;
      if (std::none_of(in.begin(), in.end(), [&](const Descriptor* x) { return x->tensor.uid == t; })) continue;
      found.push_back(op);
      if (follow_exp || !is_pointwise(op, CUDNN_POINTWISE_EXP)) frontier.push_back(op->op.output->tensor.uid);
    }
  }
  return found;
}

bool computes_exp(const Descriptor& graph, int64_t uid) {
  const std::vector<const Descriptor*> ops = downstream(graph, uid, false);
  return std::any_of(ops.begin(), ops.end(),
                     [](const Descriptor* op) { return is_pointwise(op, CUDNN_POINTWISE_EXP); });
}

bool is_matmul_of_reals(const Descriptor* op) {
  return op->op.kind == CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR && is_real(op->op.inputs[0]->tensor) &&
         is_real(op->op.inputs[1]->tensor);
}

// One tensor of the attention and what the engines need of it.
struct SdpaTensor {
  std::string name;
  const TensorInfo* t;
  int d_axis;  // the head dimension's axis, whose stride must be 1: 3, or 2 in the transposed K^T
               // and V^T; -1: not checked (the forward's statistics)
  bool fp32;   // the row statistics; the others are 16-bit
};

struct Sdpa {
  bool backward = false;
  const TensorInfo *q = nullptr, *k_t = nullptr, *v = nullptr;  // v: V (forward) or V^T (backward)
  std::vector<SdpaTensor> tensors;                               // q, k_t and v included
};

// Whether `graph` is an SDPA graph (see above); fills *s.
bool recognise_sdpa(const Descriptor& graph, Sdpa* s) {
  const Descriptor* score = nullptr;
  for (const Descriptor* op : graph.ops)
    if (is_matmul_of_reals(op) && computes_exp(graph, op->op.output->tensor.uid)) {
      score = op;
      break;
    }
  if (!score) return false;
  const int64_t scores = score->op.output->tensor.uid;
  s->q = &score->op.inputs[0]->tensor;
  s->k_t = &score->op.inputs[1]->tensor;
  std::set<int64_t> read;
  for (const Descriptor* op : graph.ops)
    for (const Descriptor* in : op->op.inputs) read.insert(in->tensor.uid);
  std::vector<const TensorInfo*> results;  // real tensors written and never read
  for (const Descriptor* op : graph.ops) {
    const TensorInfo& out = op->op.output->tensor;
    if (is_real(out) && !read.count(out.uid)) results.push_back(&out);
  }

  const Descriptor* dp = nullptr;  // backward: dP = dO V^T
  for (const Descriptor* op : graph.ops)
    if (op != score && is_matmul_of_reals(op) && !computes_exp(graph, op->op.output->tensor.uid)) {
      dp = op;
      break;
    }
  s->backward = dp != nullptr;
  if (s->backward) {
    const TensorInfo* d_o = &dp->op.inputs[0]->tensor;
    s->v = &dp->op.inputs[1]->tensor;
    s->tensors = {{"Q", s->q, 3, false}, {"K", s->k_t, 2, false}, {"V", s->v, 2, false}, {"dO", d_o, 3, false}};
    for (const Descriptor* op : graph.ops) {  // O: rowsum(dO * O)'s other factor
      if (!is_pointwise(op, CUDNN_POINTWISE_MUL) || op->op.inputs.size() < 2) continue;
      const TensorInfo &x = op->op.inputs[0]->tensor, &b = op->op.inputs[1]->tensor;
      if (&x == d_o && is_real(b)) s->tensors.push_back({"O", &b, 3, false});
      if (&b == d_o && is_real(x)) s->tensors.push_back({"O", &x, 3, false});
    }
    for (const Descriptor* op : downstream(graph, scores, false))  // Stats: subtracted before the EXP
      for (const Descriptor* in : op->op.inputs)
        if (is_real(in->tensor)) s->tensors.push_back({"Stats", &in->tensor, 3, true});
    for (const TensorInfo* r : results) s->tensors.push_back({"a gradient (dQ, dK or dV)", r, 3, false});
    return true;
  }
  const Descriptor* pv = nullptr;  // forward: O = P V
  for (const Descriptor* op : downstream(graph, scores, true))
    if (op->op.kind == CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR && is_real(op->op.inputs[1]->tensor)) {
      pv = op;
      break;
    }
  if (!pv) return false;  // scores and a softmax, no attention
  s->v = &pv->op.inputs[1]->tensor;
  const TensorInfo* o = &pv->op.output->tensor;
  s->tensors = {{"Q", s->q, 3, false}, {"K", s->k_t, 2, false}, {"V", s->v, 3, false}};
  if (is_real(*o)) s->tensors.push_back({"O", o, 3, false});
  for (const TensorInfo* r : results)
    if (r != o && r->dims.back() == 1) s->tensors.push_back({"Stats", r, -1, true});
  return true;
}

std::string type_name(cudnnDataType_t t) {
  switch (t) {
    case CUDNN_DATA_FLOAT: return "FP32";
    case CUDNN_DATA_HALF: return "FP16";
    case CUDNN_DATA_BFLOAT16: return "BF16";
    case CUDNN_DATA_INT32: return "INT32";
    case CUDNN_DATA_BOOLEAN: return "BOOLEAN";
    default: return "cudnnDataType " + std::to_string(int(t));
  }
}

std::string version_text(int64_t v) {
  return std::to_string(v / 10000) + "." + std::to_string(v % 10000 / 100) + "." + std::to_string(v % 100);
}

std::string dims_text(const TensorInfo& t) {
  std::string text;
  for (int64_t d : t.dims) text += (text.empty() ? "(" : ", ") + std::to_string(d);
  return text + ")";
}

// CUDNN_STATUS_SUCCESS, or why no fused flash-attention engine takes the SDPA graph `s` on a
// GPU of compute capability `sm` (major * 10 + minor) under cuDNN `version`.
cudnnStatus_t check_sdpa_support(const Sdpa& s, int sm, int64_t version) {
  const char* pass = s.backward ? "backward" : "forward";
  const std::string what = std::string("fused flash attention (") + pass + "): ";
  auto refuse = [&](cudnnStatus_t status, const std::string& why) { return bad(what + why, status); };
  // sdpa_support_surface.h L317-320: "SDPA FP16/BF16 requires SM80 (Ampere) or newer architecture";
  // the support matrix: "requires SM80 (Ampere) or newer architectures".
  if (sm < 80)
    return refuse(CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH, "needs sm80 or newer, this GPU is sm" + std::to_string(sm));
  // sdpa_support_surface.h L200-204 (forward), scaled_dot_product_flash_attention.h L1111-1115
  // (backward): cuDNN 9.10.0 and 9.10.1 refused for FP16/BF16 SDPA, "due to known bugs".
  if (version == 91000 || version == 91001)
    return refuse(CUDNN_STATUS_NOT_SUPPORTED,
                  "cuDNN " + version_text(version) + " has known bugs in FP16/BF16 attention");
  // scaled_dot_product_flash_attention.h L204-223 (forward: Q, K, V, O) and L1046-1070
  // (backward: those, Stats, dO, dQ, dK, dV): each is 4-D (b, h, s, d) with the head dimension's
  // stride 1 ("The stride for the last dimension corresponding to the embedding size per head
  // should be 1"); K^T and V^T are transposed views, their head dimension is axis 2.
  for (const SdpaTensor& x : s.tensors) {
    if (x.t->dims.size() != 4)
      return refuse(CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN, x.name + " is " + std::to_string(x.t->dims.size()) +
                                                                  "-D; the engines take 4-D (b, h, s, d) tensors");
    if (x.d_axis >= 0 && x.t->strides[size_t(x.d_axis)] != 1)
      return refuse(CUDNN_STATUS_NOT_SUPPORTED_LAYOUT, x.name + "'s head dimension has stride " +
                                                           std::to_string(x.t->strides[size_t(x.d_axis)]) + ", not 1");
  }
  // Data types. Backend API reference, "Fused Flash Attention fprop" and "... bprop": "Q, K^T and V
  // must be FP16 or BF16" (and so O, dO and the gradients, in the same type); the support matrix
  // lists fp16 and bf16 (fp8 is the separate FP8 graph). The statistics are FP32, as the frontend
  // declares Stats (its "intermediate data type").
  for (const SdpaTensor& x : s.tensors) {
    const bool ok = x.fp32 ? x.t->type == CUDNN_DATA_FLOAT
                           : x.t->type == CUDNN_DATA_HALF || x.t->type == CUDNN_DATA_BFLOAT16;
    if (!ok)
      return refuse(CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE,
                    x.name + " is " + type_name(x.t->type) + "; the engines take " +
                        (x.fp32 ? "FP32 statistics" : "FP16 or BF16"));
  }
  const int64_t h_q = s.q->dims[1], h_k = s.k_t->dims[1], h_v = s.v->dims[1];
  const int64_t s_q = s.q->dims[2], s_kv = s.k_t->dims[3];
  const int64_t d_qk = s.q->dims[3], d_v = s.v->dims[s.backward ? 2 : 3];
  const std::string shape = "Q " + dims_text(*s.q) + ", K^T " + dims_text(*s.k_t) + ", V" +
                            (s.backward ? "^T " : " ") + dims_text(*s.v);
  auto refuse_shape = [&](const std::string& why) {
    return refuse(CUDNN_STATUS_NOT_SUPPORTED_SHAPE, why + "; " + shape);
  };
  // sdpa_support_surface.h L67-70, scaled_dot_product_flash_attention.h L1169-1171: "number of heads
  // for key and query must be a factor of number of heads for query".
  if (h_q % h_k != 0 || h_q % h_v != 0) return refuse_shape("K/V heads that do not divide the query heads");
  // scaled_dot_product_flash_attention.h L1106-1108, and cuDNN 9.18.1's release notes (known
  // issue: "bprop is not supported when both key/value have sequence length of 1").
  if (s.backward && s_q == 1 && s_kv == 1) return refuse_shape("s_q = s_kv = 1 has no backward");
  // sdpa_support_surface.h L221-222, scaled_dot_product_flash_attention.h L1143-1162: head
  // dimensions are multiples of 8.
  if (d_qk % 8 != 0 || d_v % 8 != 0) return refuse_shape("head dimensions must be multiples of 8");
  // The support matrix's footnote 5: d_qk and d_v differ only as d_qk = 192, d_v = 128 (the
  // frontend itself checks the pair only in the backward: Hopper with cuDNN 9.11 to 9.12, L1132-1140,
  // and Blackwell, L1147-1157).
  if (d_qk != d_v && !(d_qk == 192 && d_v == 128)) return refuse_shape("d_qk != d_v (only 192 with 128 is taken)");
  // Largest head dimension. Support matrix (cuDNN 9.18.1): forward d <= 256 on every
  // architecture; backward d <= 256 on Hopper, 128 elsewhere. Older cuDNN, per the frontend:
  // forward d <= 128 on sm8x up to 9.9 and on sm10x before 9.9 (sdpa_support_surface.h
  // L323-340); backward: Hopper 256 (scaled_dot_product_flash_attention.h L1129-1145),
  // Blackwell sm10x from 9.11 128 or d_qk = 192 with d_v = 128 (L1147-1157), else 128 (L1158-1163).
  const int major = sm / 10;
  int64_t limit = 256;
  if (!s.backward && ((major == 8 && version <= 90900) || (major == 10 && version < 90900))) limit = 128;
  if (s.backward && major != 9) limit = major == 10 && version >= 91100 && d_qk == 192 && d_v == 128 ? 192 : 128;
  if (std::max(d_qk, d_v) > limit)
    return refuse_shape("head dimension " + std::to_string(std::max(d_qk, d_v)) + " above the " +
                        std::to_string(limit) + " the " + pass + " pass takes on sm" + std::to_string(sm) +
                        " with cuDNN " + version_text(version));
  return CUDNN_STATUS_SUCCESS;
}

// ---------------------------------------------------------------------------- execution

// A tensor bound to its memory for one execution.
struct Bound {
  TensorInfo info;
  void* base = nullptr;  // real: the variant pack's pointer; virtual: dense storage in the workspace
  float value = 0;       // by value: the scalar, read at cudnnBackendExecute
};

// Memory offset (in elements) of the element `logical` (row-major over dims) under t's strides.
int64_t offset_of(const TensorInfo& t, int64_t logical) {
  int64_t off = 0;
  for (size_t i = t.dims.size(); i-- > 0;) {
    off += (logical % t.dims[i]) * t.strides[i];
    logical /= t.dims[i];
  }
  return off;
}

float read(const Bound& b, int64_t logical) {
  if (b.info.by_value) return b.value;
  return load(b.base, b.info.is_virtual ? logical : offset_of(b.info, logical), b.info.type);
}

void write(const Bound& b, int64_t logical, float v) {
  store(b.base, b.info.is_virtual ? logical : offset_of(b.info, logical), b.info.type, v);
}

// The logical index in x (rank aligned right, broadcast dims at 0) of output element `logical` of y.
int64_t broadcast_index(const TensorInfo& x, const TensorInfo& y, int64_t logical) {
  if (x.dims == y.dims) return logical;
  int64_t idx[8];
  for (size_t i = y.dims.size(); i-- > 0;) {
    idx[i] = logical % y.dims[i];
    logical /= y.dims[i];
  }
  const size_t shift = y.dims.size() - x.dims.size();
  int64_t out = 0;
  for (size_t i = 0; i < x.dims.size(); ++i) out = out * x.dims[i] + (x.dims[i] == 1 ? 0 : idx[i + shift]);
  return out;
}

// x's logical index of the element at memory offset `off` under x's strides (false if no element
// of x lies there).
bool logical_at(const TensorInfo& x, int64_t off, int64_t* logical) {
  std::vector<size_t> order(x.dims.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return x.strides[a] > x.strides[b]; });
  std::vector<int64_t> idx(x.dims.size(), 0);
  for (size_t i : order) {
    idx[i] = off / x.strides[i];
    if (idx[i] >= x.dims[i]) return false;
    off -= idx[i] * x.strides[i];
  }
  if (off != 0) return false;
  int64_t l = 0;
  for (size_t i = 0; i < x.dims.size(); ++i) l = l * x.dims[i] + idx[i];
  *logical = l;
  return true;
}

// One operation of a plan, its tensors copied: it runs after the caller's descriptors may be gone.
struct Step {
  Operation op;  // its inputs and output pointers are not used here
  std::vector<int64_t> inputs;
  int64_t output = 0;
};

void run_step(const Step& step, const std::map<int64_t, Bound>& bound) {
  const Operation& op = step.op;
  const Bound& out = bound.at(step.output);
  const TensorInfo& y = out.info;
  const int64_t n = y.numel();
  switch (op.kind) {
    case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR: {
      const Bound &a = bound.at(step.inputs[0]), &bt = bound.at(step.inputs[1]);
      const size_t r = y.dims.size();
      const int64_t M = y.dims[r - 2], N = y.dims[r - 1], K = a.info.dims[r - 1];
      const int64_t batches = n / (M * N);
      // Batches in parallel: each writes its own output matrix, so the result does not depend
      // on the thread count.
#pragma omp parallel for schedule(static)
      for (int64_t bi = 0; bi < batches; ++bi) {
        std::vector<float> am(size_t(M * K)), bm(size_t(K * N));  // A row-major, B transposed: dots contiguous
        // The batch coordinates of this output matrix, broadcast into A's and B's.
        int64_t rem = bi, a_batch = 0, b_batch = 0, a_mul = 1, b_mul = 1;
        for (size_t i = r - 2; i-- > 0;) {
          const int64_t c = rem % y.dims[i];
          rem /= y.dims[i];
          a_batch += c / (y.dims[i] / a.info.dims[i]) * a_mul;  // grouped (or extent-1) broadcast
          b_batch += c / (y.dims[i] / bt.info.dims[i]) * b_mul;
          a_mul *= a.info.dims[i];
          b_mul *= bt.info.dims[i];
        }
        for (int64_t e = 0; e < M * K; ++e) am[size_t(e)] = read(a, a_batch * M * K + e);
        for (int64_t k = 0; k < K; ++k)
          for (int64_t j = 0; j < N; ++j) bm[size_t(j * K + k)] = read(bt, (b_batch * K + k) * N + j);
        for (int64_t i = 0; i < M; ++i)
          for (int64_t j = 0; j < N; ++j) {
            const float* x = &am[size_t(i * K)];
            const float* y = &bm[size_t(j * K)];
            write(out, (bi * M + i) * N + j, float(ptrain::sim::dot(x, y, K)));
          }
      }
      return;
    }
    case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR: {
      const Bound& x = bound.at(step.inputs[0]);
#pragma omp parallel for schedule(static)
      for (int64_t e = 0; e < n; ++e) {
        float v = 0.0f;
        if (op.mode == CUDNN_POINTWISE_GEN_INDEX) {
          int64_t rem = e;
          for (int64_t i = int64_t(y.dims.size()) - 1; i > op.axis; --i) rem /= y.dims[size_t(i)];
          v = float(rem % y.dims[size_t(op.axis)]);
          write(out, e, v);
          continue;
        }
        const float xv = read(x, broadcast_index(x.info, y, e));
        if (step.inputs.size() == 1) {
          const float xs = op.alpha1 * xv;
          v = op.mode == CUDNN_POINTWISE_EXP ? std::exp(xs) : op.mode == CUDNN_POINTWISE_LOG ? std::log(xs) : xs;
        } else {
          const Bound& bx = bound.at(step.inputs[1]);
          const float bv = read(bx, broadcast_index(bx.info, y, e));
          switch (op.mode) {
            case CUDNN_POINTWISE_ADD: v = op.alpha1 * xv + op.alpha2 * bv; break;
            case CUDNN_POINTWISE_SUB: v = op.alpha1 * xv - op.alpha2 * bv; break;
            case CUDNN_POINTWISE_MUL: v = (op.alpha1 * xv) * (op.alpha2 * bv); break;
            case CUDNN_POINTWISE_DIV: v = (op.alpha1 * xv) / (op.alpha2 * bv); break;
            case CUDNN_POINTWISE_CMP_GE: v = xv >= bv ? 1.0f : 0.0f; break;
            case CUDNN_POINTWISE_BINARY_SELECT: {
              const Bound& t = bound.at(step.inputs[2]);
              v = read(t, broadcast_index(t.info, y, e)) != 0.0f ? xv : bv;
              break;
            }
            default: break;
          }
        }
        write(out, e, v);
      }
      return;
    }
    case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR: {
      const Bound& x = bound.at(step.inputs[0]);
      std::vector<double> acc(size_t(n), op.reduce == CUDNN_REDUCE_TENSOR_MAX ? -INFINITY : 0.0);
      for (int64_t e = 0; e < x.info.numel(); ++e) {
        // The output element this input element reduces into.
        int64_t rem = e, o = 0, mul = 1;
        for (size_t i = x.info.dims.size(); i-- > 0;) {
          const int64_t c = rem % x.info.dims[i];
          rem /= x.info.dims[i];
          o += c / (x.info.dims[i] / y.dims[i]) * mul;  // extent 1: everything; else groups
          mul *= y.dims[i];
        }
        const double v = read(x, e);
        acc[size_t(o)] = op.reduce == CUDNN_REDUCE_TENSOR_MAX ? std::max(acc[size_t(o)], v) : acc[size_t(o)] + v;
      }
      for (int64_t e = 0; e < n; ++e) write(out, e, float(acc[size_t(e)]));
      return;
    }
    case CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR: {
      const Bound& x = bound.at(step.inputs[0]);
      for (int64_t e = 0; e < n; ++e) {
        // y's element is the one at y's offset in the memory x describes.
        int64_t xl = 0;
        if (!x.info.is_virtual)
          write(out, e, load(x.base, offset_of(y, e), x.info.type));
        else if (logical_at(x.info, offset_of(y, e), &xl))
          write(out, e, read(x, xl));
        else
          throw std::runtime_error("cuDNN simulation: a reshape reads outside its input's layout");
      }
      return;
    }
    default: return;
  }
}

// The graph's operations in an order where every input is written before it is read.
std::vector<Step> schedule(const Descriptor& graph) {
  std::set<int64_t> produced;
  for (const Descriptor* op : graph.ops) produced.insert(op->op.output->tensor.uid);
  std::vector<Step> order;
  std::set<int64_t> ready;
  std::vector<const Descriptor*> left(graph.ops.begin(), graph.ops.end());
  while (!left.empty()) {
    auto it = std::find_if(left.begin(), left.end(), [&](const Descriptor* op) {
      for (const Descriptor* in : op->op.inputs)
        if (produced.count(in->tensor.uid) && !ready.count(in->tensor.uid)) return false;
      return true;
    });
    if (it == left.end()) throw std::runtime_error("cuDNN simulation: the operation graph has a cycle");
    Step step;
    step.op = (*it)->op;
    for (const Descriptor* in : (*it)->op.inputs) step.inputs.push_back(in->tensor.uid);
    step.output = (*it)->op.output->tensor.uid;
    order.push_back(std::move(step));
    ready.insert(step.output);
    left.erase(it);
  }
  return order;
}

std::vector<const TensorInfo*> graph_tensors(const Descriptor& graph) {
  std::map<int64_t, const TensorInfo*> by_uid;
  for (const Descriptor* op : graph.ops) {
    for (const Descriptor* in : op->op.inputs) by_uid[in->tensor.uid] = &in->tensor;
    by_uid[op->op.output->tensor.uid] = &op->op.output->tensor;
  }
  std::vector<const TensorInfo*> out;
  for (const auto& [uid, t] : by_uid) out.push_back(t);
  return out;
}

int64_t workspace_of(const Descriptor& graph) {
  int64_t bytes = 0;
  for (const TensorInfo* t : graph_tensors(graph))
    if (t->is_virtual) bytes += align256(t->numel() * int64_t(element_size(t->type)));
  return bytes;
}

Descriptor* as_descriptor(cudnnBackendDescriptor_t d) { return static_cast<Descriptor*>(d); }

}  // namespace

extern "C" {

// The headers' version, or PTRAIN_SIM_CUDNN_VERSION's (tests of what older versions need).
size_t cudnnGetVersion(void) {
  const char* v = std::getenv("PTRAIN_SIM_CUDNN_VERSION");
  return v && *v ? std::strtoull(v, nullptr, 10) : CUDNN_VERSION;
}

const char* cudnnGetErrorString(cudnnStatus_t status) {
  switch (status) {
    case CUDNN_STATUS_SUCCESS: return "CUDNN_STATUS_SUCCESS";
    case CUDNN_STATUS_NOT_INITIALIZED: return "CUDNN_STATUS_NOT_INITIALIZED";
    case CUDNN_STATUS_BAD_PARAM: return "CUDNN_STATUS_BAD_PARAM";
    case CUDNN_STATUS_NOT_SUPPORTED: return "CUDNN_STATUS_NOT_SUPPORTED";
    case CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN: return "CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN";
    case CUDNN_STATUS_NOT_SUPPORTED_SHAPE: return "CUDNN_STATUS_NOT_SUPPORTED_SHAPE";
    case CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE: return "CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE";
    case CUDNN_STATUS_NOT_SUPPORTED_LAYOUT: return "CUDNN_STATUS_NOT_SUPPORTED_LAYOUT";
    case CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH: return "CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH";
    case CUDNN_STATUS_EXECUTION_FAILED: return "CUDNN_STATUS_EXECUTION_FAILED";
    default: return "CUDNN_STATUS_INTERNAL_ERROR";
  }
}

void cudnnGetLastErrorString(char* message, size_t max_size) {
  if (!message || max_size == 0) return;
  std::snprintf(message, max_size, "%s", last_error.c_str());
  last_error.clear();
}

cudnnStatus_t cudnnCreate(cudnnHandle_t* handle) {
  if (const int injected = ptrain::sim::injected_failure(__func__))
    return bad("cudnnCreate: injected failure", static_cast<cudnnStatus_t>(injected));
  Handle* h = new Handle;
  cudaGetDevice(&h->device);
  *handle = reinterpret_cast<cudnnHandle_t>(h);
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnDestroy(cudnnHandle_t handle) {
  delete reinterpret_cast<Handle*>(handle);
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t stream) {
  reinterpret_cast<Handle*>(handle)->stream = stream;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t type, cudnnBackendDescriptor_t* out) {
  if (!schema().count(type)) return bad("a descriptor type the simulation does not model", CUDNN_STATUS_NOT_SUPPORTED);
  Descriptor* d = new Descriptor;
  d->type = type;
  *out = d;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t d) {
  delete as_descriptor(d);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t desc, cudnnBackendAttributeName_t name,
                                       cudnnBackendAttributeType_t type, int64_t count, const void* values) {
  Descriptor* d = as_descriptor(desc);
  if (!d || !values || count <= 0) return bad("cudnnBackendSetAttribute: null descriptor or values, or count <= 0");
  if (d->finalized) return bad("cudnnBackendSetAttribute: the descriptor is finalized", CUDNN_STATUS_NOT_INITIALIZED);
  const auto& attrs = schema().at(d->type);
  auto it = attrs.find(name);
  if (it == attrs.end()) return bad("attribute " + std::to_string(int(name)) + " does not belong to this descriptor");
  if (it->second != type)
    return bad("attribute " + std::to_string(int(name)) + " takes type " + std::to_string(int(it->second)) +
               ", not " + std::to_string(int(type)));
  const unsigned char* bytes = static_cast<const unsigned char*>(values);
  d->attrs[name].assign(bytes, bytes + size_t(count) * attribute_type_size(type));
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t desc) {
  Descriptor* d = as_descriptor(desc);
  if (!d) return bad("cudnnBackendFinalize: null descriptor");
  if (const int injected = ptrain::sim::injected_failure(d->type == CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR
                                                               ? "cudnnBackendFinalize execution plan"
                                                               : "cudnnBackendFinalize"))
    return bad("cudnnBackendFinalize: injected failure", static_cast<cudnnStatus_t>(injected));
  if (d->finalized) return bad("cudnnBackendFinalize: finalized twice", CUDNN_STATUS_NOT_INITIALIZED);
  cudnnStatus_t status = CUDNN_STATUS_SUCCESS;
  switch (d->type) {
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR: status = finalize_tensor(*d); break;
    case CUDNN_BACKEND_MATMUL_DESCRIPTOR: {
      cudnnDataType_t t{};
      if (!d->one(CUDNN_ATTR_MATMUL_COMP_TYPE, &t)) status = bad("matmul descriptor: COMP_TYPE is required");
      break;
    }
    case CUDNN_BACKEND_POINTWISE_DESCRIPTOR: {
      cudnnPointwiseMode_t m{};
      cudnnDataType_t t{};
      if (!d->one(CUDNN_ATTR_POINTWISE_MODE, &m) || !d->one(CUDNN_ATTR_POINTWISE_MATH_PREC, &t))
        status = bad("pointwise descriptor: MODE and MATH_PREC are required");
      break;
    }
    case CUDNN_BACKEND_REDUCTION_DESCRIPTOR: {
      cudnnReduceTensorOp_t o{};
      cudnnDataType_t t{};
      if (!d->one(CUDNN_ATTR_REDUCTION_OPERATOR, &o) || !d->one(CUDNN_ATTR_REDUCTION_COMP_TYPE, &t))
        status = bad("reduction descriptor: OPERATOR and COMP_TYPE are required");
      break;
    }
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR: status = finalize_graph(*d); break;
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR: {
      cudnnBackendHeurMode_t mode{};
      const Descriptor* g = d->child(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH);
      if (!g || !g->finalized || !d->one(CUDNN_ATTR_ENGINEHEUR_MODE, &mode))
        status = bad("engine heuristics: OPERATION_GRAPH and MODE are required");
      d->graph = g;
      break;
    }
    case CUDNN_BACKEND_ENGINE_DESCRIPTOR: {
      const Descriptor* g = d->child(CUDNN_ATTR_ENGINE_OPERATION_GRAPH);
      int64_t index = -1;
      if (!g || !g->finalized || !d->one(CUDNN_ATTR_ENGINE_GLOBAL_INDEX, &index))
        status = bad("engine: OPERATION_GRAPH and GLOBAL_INDEX are required");
      else if (index != 0)
        status = bad("engine: the simulation has engine 0 only", CUDNN_STATUS_NOT_SUPPORTED);
      d->graph = g;
      break;
    }
    case CUDNN_BACKEND_ENGINECFG_DESCRIPTOR: {
      const Descriptor* e = d->child(CUDNN_ATTR_ENGINECFG_ENGINE);
      if (!e || !e->finalized) status = bad("engine configuration: ENGINE is required");
      else d->graph = e->graph;
      break;
    }
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR: {
      const Descriptor* c = d->child(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG);
      if (!c || !c->finalized) {
        status = bad("execution plan: ENGINE_CONFIG is required");
      } else {
        d->graph = c->graph;
        // The handle: the plan's, else the operation graph's (optional from cuDNN 9.8).
        Handle* h = nullptr;
        if (!d->one(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, &h)) d->graph->one(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, &h);
        if (!h) status = bad("execution plan: no handle (neither the plan's nor its operation graph's)");
        d->workspace = workspace_of(*d->graph);
        // An attention graph outside the fused engines' support surface has no engine.
        Sdpa sdpa;
        if (status == CUDNN_STATUS_SUCCESS && recognise_sdpa(*d->graph, &sdpa)) {
          int major = 0, minor = 0;
          cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, h->device);
          cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, h->device);
          status = check_sdpa_support(sdpa, major * 10 + minor, int64_t(cudnnGetVersion()));
        }
      }
      break;
    }
    case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR: {
      d->uids = d->values<int64_t>(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS);
      d->pointers = d->values<void*>(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS);
      d->one(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, &d->workspace_ptr);
      if (d->uids.size() != d->pointers.size()) status = bad("variant pack: UNIQUE_IDS and DATA_POINTERS differ in count");
      break;
    }
    default:
      if (is_operation(d->type)) status = finalize_operation(*d);
      break;
  }
  if (status == CUDNN_STATUS_SUCCESS) d->finalized = true;
  return status;
}

cudnnStatus_t cudnnBackendGetAttribute(cudnnBackendDescriptor_t const desc, cudnnBackendAttributeName_t name,
                                       cudnnBackendAttributeType_t type, int64_t requested, int64_t* count,
                                       void* values) {
  const Descriptor* d = as_descriptor(desc);
  if (!d || !d->finalized) return bad("cudnnBackendGetAttribute: not finalized", CUDNN_STATUS_NOT_INITIALIZED);
  const auto& attrs = schema().at(d->type);
  auto it = attrs.find(name);
  if (it == attrs.end() || it->second != type) return bad("cudnnBackendGetAttribute: wrong attribute or type");
  // Descriptors come back by copying into descriptors the caller created (Backend API, "cudnnBackendGetAttribute").
  auto copy_into = [](const Descriptor& from, void* to) -> cudnnStatus_t {
    Descriptor* t = as_descriptor(static_cast<void**>(to)[0]);
    if (!t || t->type != from.type) return CUDNN_STATUS_BAD_PARAM;
    *t = from;
    return CUDNN_STATUS_SUCCESS;
  };
  if (d->type == CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR && name == CUDNN_ATTR_ENGINEHEUR_RESULTS) {
    *count = 1;  // one engine: the interpreter
    if (requested >= 1 && values) {
      Descriptor engine;
      engine.type = CUDNN_BACKEND_ENGINE_DESCRIPTOR;
      engine.finalized = true;
      engine.graph = d->graph;
      const int64_t index = 0;
      engine.attrs[CUDNN_ATTR_ENGINE_GLOBAL_INDEX].assign(reinterpret_cast<const unsigned char*>(&index),
                                                          reinterpret_cast<const unsigned char*>(&index) + 8);
      Descriptor* target = as_descriptor(static_cast<void**>(values)[0]);
      if (!target || target->type != CUDNN_BACKEND_ENGINECFG_DESCRIPTOR) return CUDNN_STATUS_BAD_PARAM;
      target->finalized = true;
      target->graph = d->graph;
      target->engine_storage = std::make_shared<Descriptor>(engine);
      Descriptor* engine_ptr = target->engine_storage.get();
      target->attrs[CUDNN_ATTR_ENGINECFG_ENGINE].assign(reinterpret_cast<const unsigned char*>(&engine_ptr),
                                                        reinterpret_cast<const unsigned char*>(&engine_ptr) + sizeof(void*));
    }
    return CUDNN_STATUS_SUCCESS;
  }
  if (d->type == CUDNN_BACKEND_ENGINECFG_DESCRIPTOR && name == CUDNN_ATTR_ENGINECFG_ENGINE) {
    const Descriptor* e = d->child(CUDNN_ATTR_ENGINECFG_ENGINE);
    if (!e || requested < 1 || !values) return CUDNN_STATUS_BAD_PARAM;
    *count = 1;
    return copy_into(*e, values);
  }
  if (d->type == CUDNN_BACKEND_ENGINE_DESCRIPTOR && name == CUDNN_ATTR_ENGINE_NUMERICAL_NOTE) {
    *count = 0;  // the interpreter claims none
    return CUDNN_STATUS_SUCCESS;
  }
  if (d->type == CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR && name == CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE) {
    *count = 1;
    if (requested >= 1 && values) std::memcpy(values, &d->workspace, 8);
    return CUDNN_STATUS_SUCCESS;
  }
  auto a = d->attrs.find(name);
  if (a == d->attrs.end()) {
    *count = 0;
    return CUDNN_STATUS_SUCCESS;
  }
  const size_t size = attribute_type_size(type);
  *count = int64_t(a->second.size() / size);
  if (values) std::memcpy(values, a->second.data(), size_t(std::min(requested, *count)) * size);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendExecute(cudnnHandle_t handle, cudnnBackendDescriptor_t plan_desc,
                                  cudnnBackendDescriptor_t pack_desc) {
  const Descriptor* plan = as_descriptor(plan_desc);
  const Descriptor* pack = as_descriptor(pack_desc);
  if (!handle || !plan || !pack || !plan->finalized || !pack->finalized ||
      plan->type != CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR || pack->type != CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)
    return bad("cudnnBackendExecute: a finalized plan and variant pack are required");
  const Descriptor& graph = *plan->graph;
  std::map<int64_t, void*> given;
  for (size_t i = 0; i < pack->uids.size(); ++i) given[pack->uids[i]] = pack->pointers[i];
  if (plan->workspace > 0 &&
      (!pack->workspace_ptr || !ptrain::sim::is_device_range(pack->workspace_ptr, size_t(plan->workspace))))
    return bad("variant pack: the workspace is missing or smaller than the plan's " + std::to_string(plan->workspace) +
               " bytes");
  std::map<int64_t, Bound> bound;
  char* ws = static_cast<char*>(pack->workspace_ptr);
  for (const TensorInfo* t : graph_tensors(graph)) {
    Bound b;
    b.info = *t;
    if (t->is_virtual) {
      b.base = ws;
      ws += align256(t->numel() * int64_t(element_size(t->type)));
    } else {
      auto it = given.find(t->uid);
      if (it == given.end() || !it->second) return bad("variant pack: no pointer for tensor uid " + std::to_string(t->uid));
      if (t->by_value) {
        b.value = load(it->second, 0, t->type);  // read now: the caller's variable may be gone when the work runs
      } else {
        int64_t extent = 0;  // the furthest element the strides reach
        for (size_t i = 0; i < t->dims.size(); ++i) extent += (t->dims[i] - 1) * t->strides[i];
        if (!ptrain::sim::is_device_range(it->second, size_t(extent + 1) * element_size(t->type)))
          return bad("variant pack: tensor uid " + std::to_string(t->uid) + " is not device memory up to its last element");
        if (reinterpret_cast<uintptr_t>(it->second) % uintptr_t(t->alignment) != 0)
          return bad("variant pack: tensor uid " + std::to_string(t->uid) + " is not aligned to its declared " +
                     std::to_string(t->alignment) + " bytes");
        b.base = it->second;
      }
    }
    bound[t->uid] = b;
  }
  std::vector<Step> order = schedule(graph);
  const cudaError_t status =
      ptrain::sim::enqueue(reinterpret_cast<Handle*>(handle)->stream, "cudnnBackendExecute",
                           [bound = std::move(bound), order = std::move(order)]() {
                             for (const Step& step : order) run_step(step, bound);
                           });
  return status == cudaSuccess ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_EXECUTION_FAILED;
}

}  // extern "C"
