// Operands of other dtypes than the one an op computes in: converted into the op's staging
// scratch before it runs, and outputs converted back (rounded to their formats) after. Every op
// takes mixed dtypes this way, so no op needs a kernel for each pair of dtypes.
#include "backend/cuda/cuda_backend_impl.h"

#include "backend/cuda/kernel_formats.h"
#include "core/error.h"
#include "convert.cuh"

namespace ptrain::cuda_impl {

Tensor CudaBackend::Staged::in(const Tensor& t, DType want) {
  if (t.empty() || t.dtype == want) return t;
  Tensor s = buffer(t, want);
  be_.convert(s, t, Format::fp32);
  return s;
}

Tensor CudaBackend::Staged::out(const Tensor& t, DType want, bool accumulate) {
  if (t.empty()) return t;
  if (t.dtype == want) {
    if (needs_rounding(t)) pending_.push_back(Pending{t, t});
    return t;
  }
  Tensor s = buffer(t, want);
  if (accumulate) be_.convert(s, t, Format::fp32);
  pending_.push_back(Pending{t, s});
  return s;
}

void CudaBackend::Staged::finish() {
  for (const Pending& p : pending_) be_.convert(p.dst, p.staged, p.dst.format);
  pending_.clear();
}

Tensor CudaBackend::Staged::buffer(const Tensor& t, DType want) {
  PTRAIN_CHECK(next_ < kStageSlots, "cuda backend: an op staged more operands than there are staging slots");
  Tensor s = t;
  s.dtype = want;
  s.data = be_.scratch(static_cast<Slot>(kStageFirst + next_), static_cast<size_t>(t.numel()) * dtype_size(want));
  ++next_;
  return s;
}

// dst = src converted to dst's dtype and rounded to `round` (Format::fp32: only the dtype's
// own rounding). dst may be src itself (rounding in place).
void CudaBackend::convert(const Tensor& dst, const Tensor& src, Format round) {
  const size_t n = static_cast<size_t>(dst.numel());
  if (n == 0) return;
  if (dst.data == src.data && dst.dtype == src.dtype && (round == Format::fp32 || round == natural_format(dst.dtype)))
    return;
  with_float_type(dst.dtype, "convert", [&](auto dst_tag) {
    PTRAIN_ELEMENT_TYPE(D, dst_tag);
    with_float_type(src.dtype, "convert", [&](auto src_tag) {
      PTRAIN_ELEMENT_TYPE(S, src_tag);
      kernels::convert<D, S>(dst.as<D>(), src.as<S>(), n, round_format(round), stream_);
    });
  });
}

}  // namespace ptrain::cuda_impl
