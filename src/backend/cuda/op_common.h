// What the ops of the CUDA backend share: the checks of their operands, the dispatch from a
// tensor's dtype to the kernels' element type, and the rules of rounding to a format. An op's
// operands arrive as Tensors (pointer, dtype, shape, device); a wrong one is a bug of the caller,
// so it fails with the op's and the operand's names (std::logic_error), as a rule before the op
// queues work (a size too large for the kernels' int may be found after an operand was staged).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>

#include <library_types.h>

#include "core/tensor.h"
#include "common.cuh"  // kernels::bf16, kernels::fp16 (kernels/ is on the include path)
#include "precision/formats.h"

namespace ptrain::cuda_impl {

using kernels::bf16;
using kernels::fp16;
using kernels::fp8;

[[noreturn]] inline void fail(const char* op, const std::string& what) {
  throw std::logic_error(std::string("cuda backend ") + op + ": " + what);
}
// Checks `cond`; the message (any string expression) is built only when it fails.
#define PTRAIN_EXPECT(cond, op, what)                     \
  do {                                                    \
    if (!(cond)) ::ptrain::cuda_impl::fail((op), (what)); \
  } while (0)

inline bool is_float(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; }

// The format a storage dtype rounds to by itself.
inline Format natural_format(DType t) {
  switch (t) {
    case DType::bf16: return Format::bf16;
    case DType::f16: return Format::fp16;
    default: return Format::fp32;
  }
}

// A tensor stored wider than its format (f32 storage of bf16 values, anything of an FP8 format)
// is rounded to the format after an op writes it.
inline bool needs_rounding(const Tensor& t) {
  return !t.empty() && t.format != Format::fp32 && t.format != natural_format(t.dtype);
}

inline cudaDataType_t cuda_type(DType t) {
  if (t == DType::bf16) return CUDA_R_16BF;
  if (t == DType::f16) return CUDA_R_16F;
  if (t != DType::f32) fail("gemm", std::string("no cuBLASLt type for dtype ") + dtype_name(t));
  return CUDA_R_32F;
}

// Calls fn(Tag<T>{}) with T the storage type of dtype t (float, bf16 or fp16).
template <typename T>
struct Tag {
  using type = T;
};
template <typename Fn>
void with_float_type(DType t, const char* op, Fn&& fn) {
  switch (t) {
    case DType::f32: fn(Tag<float>{}); return;
    case DType::bf16: fn(Tag<bf16>{}); return;
    case DType::f16: fn(Tag<fp16>{}); return;
    default:
      fail(op, std::string("dtype ") + dtype_name(t) + " is not a float dtype of the CUDA backend (f32, bf16, f16)");
  }
}

// Parameter gradients. An op adds into FP32 gradients (the main gradients, Transformer::grad)
// as they are, whatever dtype it computes in: no staged copy and no rounding to the activations'
// type. Gradients of another dtype are staged to the op's dtype `dt` as any operand is.
inline DType gradient_dtype(const Tensor& grad, DType dt) { return grad.dtype == DType::f32 ? DType::f32 : dt; }
// Calls fn(Tag<G>{}) with G float for FP32 gradients (gradient_dtype), else T.
template <typename T, typename Fn>
void with_gradient_type(DType g, Fn&& fn) {
  if (g == DType::f32)
    fn(Tag<float>{});
  else
    fn(Tag<T>{});
}

// Names the element type of a with_float_type callback (and marks its tag as used).
#define PTRAIN_ELEMENT_TYPE(T, tag)       \
  using T = typename decltype(tag)::type; \
  (void)(tag)

// A float operand in device memory; empty tensors (optional operands) pass.
inline void expect_float(const char* op, const char* name, const Tensor& t) {
  if (t.empty()) return;
  PTRAIN_EXPECT(t.device == Device::cuda, op, std::string(name) + " is not in device memory");
  if (t.dtype == DType::f64)
    fail(op, std::string(name) + " is f64: the CUDA backend stores floats as f32, bf16 or f16 (f64 serves the CPU " +
                 "reference's gradient checks only)");
  PTRAIN_EXPECT(is_float(t.dtype), op,
                std::string(name) + " has dtype " + dtype_name(t.dtype) + ", not f32, bf16 or f16");
}

inline void expect_tokens(const char* op, const char* name, const Tensor& t) {
  PTRAIN_EXPECT(!t.empty() && t.device == Device::cuda && t.dtype == DType::i32, op,
                std::string(name) + " must be an i32 tensor in device memory");
}

// A named operand, for checking several alike.
struct Operand {
  const char* name;
  const Tensor* tensor;
};

// The float operands of an op: those in `required` present, every one (the optional ones when
// given) a float tensor in device memory.
inline void expect_floats(const char* op, std::initializer_list<Operand> required,
                          std::initializer_list<Operand> optional = {}) {
  for (const Operand& o : required) {
    PTRAIN_EXPECT(!o.tensor->empty(), op, std::string(o.name) + " must not be empty");
    expect_float(op, o.name, *o.tensor);
  }
  for (const Operand& o : optional) expect_float(op, o.name, *o.tensor);
}

// An elementwise op's operands: non-empty float tensors with the first one's element count,
// which is returned.
inline int64_t elementwise_size(const char* op, std::initializer_list<Operand> operands) {
  expect_floats(op, operands);
  const Operand& first = *operands.begin();
  for (const Operand& o : operands)
    PTRAIN_EXPECT(o.tensor->numel() == first.tensor->numel(), op,
                  "shape mismatch: " + std::string(first.name) + " " + first.tensor->shape_string() + ", " + o.name +
                      " " + o.tensor->shape_string());
  return first.tensor->numel();
}

// The kernels index with int: sizes must fit.
inline int to_int(int64_t v, const char* op, const char* what) {
  PTRAIN_EXPECT(v >= 0 && v <= INT32_MAX, op,
                std::string(what) + " = " + std::to_string(v) + " does not fit the kernels' 32-bit sizes");
  return static_cast<int>(v);
}

inline int64_t last_dim(const Tensor& t) { return t.ndim > 0 ? t.dim(-1) : 1; }

}  // namespace ptrain::cuda_impl
