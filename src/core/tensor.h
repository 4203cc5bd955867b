// A non-owning view of device or host memory: pointer, dtype, shape, and the number format its
// values lie on. Backends receive these and check dtypes and shapes before touching the memory;
// the model never dereferences them. The CPU backend emulates reduced precision by storing
// floats rounded to `format`'s grid; a GPU backend stores the format itself.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/error.h"

namespace ptrain {

// The number format a tensor's values lie on (precision/formats.h rounds and converts them).
enum class Format { fp32, bf16, fp16, e4m3, e5m2 };

// How a tensor's elements are stored. f64 exists for the reference backend's gradient checks;
// the CPU backend stores reduced precision as f32 values on the format's grid, a GPU backend as
// bf16 / f16 themselves (Backend::storage_for). i32 holds token ids; u8 a GPU's FP8 codes
// (Fp8Gemms::weight_codes).
enum class DType { f32, f64, i32, bf16, f16, u8 };

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::f64: return 8;
    case DType::bf16:
    case DType::f16: return 2;
    case DType::u8: return 1;
    default: return 4;
  }
}
inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::i32: return "i32";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::u8: return "u8";
  }
  return "?";
}

enum class Device { cpu, cuda };

// The number of elements of a shape (1 for none).
inline int64_t shape_numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (const int64_t d : shape) n *= d;
  return n;
}

struct Tensor {
  static constexpr int kMaxDims = 5;

  void* data = nullptr;
  DType dtype = DType::f32;
  Device device = Device::cpu;
  int ndim = 0;
  std::array<int64_t, kMaxDims> shape{};
  Format format = Format::fp32;  // the grid an op rounds this tensor's values to when writing it

  Tensor() = default;
  Tensor(void* ptr, DType t, std::initializer_list<int64_t> dims, Device dev = Device::cpu)
      : data(ptr), dtype(t), device(dev), ndim(static_cast<int>(dims.size())) {
    PTRAIN_CHECK(dims.size() <= kMaxDims, "too many tensor dimensions");
    int i = 0;
    for (int64_t d : dims) shape[i++] = d;
  }

  Tensor(void* ptr, DType t, const std::vector<int64_t>& dims, Device dev = Device::cpu)
      : data(ptr), dtype(t), device(dev), ndim(static_cast<int>(dims.size())) {
    PTRAIN_CHECK(dims.size() <= kMaxDims, "too many tensor dimensions");
    for (size_t i = 0; i < dims.size(); ++i) shape[i] = dims[i];
  }

  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= shape[i];
    return n;
  }
  size_t bytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  int64_t dim(int i) const { return shape[i < 0 ? ndim + i : i]; }
  bool empty() const { return data == nullptr; }

  template <typename T>
  T* as() const { return static_cast<T*>(data); }

  // Elements [offset, offset + count) of a contiguous tensor, as a 1-D tensor (same dtype and format).
  Tensor range(int64_t offset, int64_t count) const {
    Tensor t = *this;
    t.data = static_cast<char*>(data) + static_cast<size_t>(offset) * dtype_size(dtype);
    t.ndim = 1;
    t.shape = {count};
    return t;
  }

  // The same elements viewed with another shape of equal size.
  Tensor reshaped(const std::vector<int64_t>& dims) const {
    Tensor t(data, dtype, dims, device);
    t.format = format;
    PTRAIN_CHECK(t.numel() == numel(), "reshape to a different number of elements");
    return t;
  }

  // The slice along the first dimension (e.g. one layer of a (L, ...) stacked parameter).
  Tensor operator[](int64_t i) const {
    Tensor t;
    t.dtype = dtype;
    t.device = device;
    t.format = format;
    t.ndim = ndim - 1;
    for (int d = 1; d < ndim; ++d) t.shape[d - 1] = shape[d];
    t.data = static_cast<char*>(data) + static_cast<size_t>(i) * t.bytes();
    return t;
  }

  Tensor with_format(Format f) const {
    Tensor t = *this;
    t.format = f;
    return t;
  }

  std::string shape_string() const {
    std::string s = "(";
    for (int i = 0; i < ndim; ++i) s += (i ? "," : "") + std::to_string(shape[i]);
    return s + ")";
  }
};

}  // namespace ptrain
