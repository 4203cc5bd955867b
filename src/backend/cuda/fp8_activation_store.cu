// The CUDA backend's FP8 activation store (Backend::make_fp8_activation_store): E4M3/E5M2 codes,
// a byte each, with one factor (1 / scale) per 1 x kFp8StoreTile tile, in the arena; store and
// load are one kernel each on the backend's stream, so recorded micro-batches replay them.
#include "backend/cuda/cuda_backend_impl.h"

#include <cstring>
#include <vector>

#include "backend/cuda/arena_sizing.h"
#include "backend/cuda/kernel_formats.h"
#include "convert.cuh"
#include "core/error.h"

namespace ptrain::cuda_impl {

static_assert(sizeof(DeviceScalars) <= kFp8TallyBytes && kFp8TallyBytes % alignof(DeviceScalars) == 0);

class CudaBackend::CudaFp8ActivationStore final : public Fp8ActivationStore {
 public:
  CudaFp8ActivationStore(CudaBackend& be, int layers, int64_t rows, int64_t cols, Format format)
      : be_(be), layers_(layers), rows_(rows), cols_(cols),
        tiles_(rows * ((cols + kFp8StoreTile - 1) / kFp8StoreTile)), format_(fp8_interpretation(format)) {
    const char* op = "fp8_activation_store";
    to_int(rows, op, "rows");
    to_int(cols, op, "columns");
    to_int(tiles_, op, "tiles");
    try {
      codes_ = static_cast<fp8*>(be_.allocate(static_cast<size_t>(layers * rows * cols)));
      factors_ = static_cast<float*>(be_.allocate(static_cast<size_t>(layers * tiles_) * sizeof(float)));
      tally_ = static_cast<char*>(be_.allocate(static_cast<size_t>(layers + 1) * kFp8TallyBytes));
    } catch (...) {
      release();
      throw;
    }
  }
  ~CudaFp8ActivationStore() override { release(); }
  CudaFp8ActivationStore(const CudaFp8ActivationStore&) = delete;
  CudaFp8ActivationStore& operator=(const CudaFp8ActivationStore&) = delete;

  void store(int layer, Tensor in, bool record) override {
    const char* op = "fp8_activation_store.store";
    expect_floats(op, {{"in", &in}});
    PTRAIN_EXPECT(in.numel() == rows_ * cols_, op, "in " + in.shape_string() + " is not one layer of the store");
    PTRAIN_EXPECT(layer >= 0 && layer < layers_, op, "layer " + std::to_string(layer) + " is not in the store");
    DeviceScalars* tally = tally_of(record ? layer : layers_);  // the last: unrecorded casts
    with_float_type(in.dtype, op, [&](auto tag) {
      PTRAIN_ELEMENT_TYPE(T, tag);
      kernels::fp8_quantize_blocks<T>(layer_codes(layer), layer_factors(layer), &tally->amax, &tally->counts,
                                      in.as<T>(), static_cast<int>(rows_), static_cast<int>(cols_), 1, kFp8StoreTile,
                                      format_, be_.stream_);
    });
  }

  void load(int layer, Tensor out) override {
    const char* op = "fp8_activation_store.load";
    expect_floats(op, {{"out", &out}});
    PTRAIN_EXPECT(out.numel() == rows_ * cols_, op, "out " + out.shape_string() + " is not one layer of the store");
    PTRAIN_EXPECT(layer >= 0 && layer < layers_, op, "layer " + std::to_string(layer) + " is not in the store");
    with_float_type(out.dtype, op, [&](auto tag) {
      PTRAIN_ELEMENT_TYPE(T, tag);
      kernels::fp8_dequantize_blocks<T>(out.as<T>(), layer_codes(layer), layer_factors(layer), static_cast<int>(rows_),
                                        static_cast<int>(cols_), 1, kFp8StoreTile, format_, be_.stream_);
    });
  }

  // Read back (waiting for the stream), then zeroed in stream order.
  std::vector<Fp8CastStats> take_stats() override {
    std::vector<char> host(static_cast<size_t>(layers_) * kFp8TallyBytes);
    PTRAIN_CUDA_CHECK(cudaMemcpyAsync(host.data(), tally_, host.size(), cudaMemcpyDeviceToHost, be_.stream_));
    be_.sync();
    PTRAIN_CUDA_CHECK(cudaMemsetAsync(tally_, 0, host.size(), be_.stream_));
    std::vector<Fp8CastStats> taken;
    for (int l = 0; l < layers_; ++l) {
      DeviceScalars d;
      std::memcpy(&d, host.data() + static_cast<size_t>(l) * kFp8TallyBytes, sizeof d);
      taken.push_back(to_stats(d));
    }
    return taken;
  }

 private:
  DeviceScalars* tally_of(int slot) const {
    return reinterpret_cast<DeviceScalars*>(tally_ + static_cast<size_t>(slot) * kFp8TallyBytes);
  }
  fp8* layer_codes(int layer) const { return codes_ + static_cast<size_t>(layer) * rows_ * cols_; }
  float* layer_factors(int layer) const { return factors_ + static_cast<size_t>(layer) * tiles_; }
  void release() noexcept {
    for (void* p : {static_cast<void*>(codes_), static_cast<void*>(factors_), static_cast<void*>(tally_)}) {
      if (!p) continue;
      try {
        be_.release(p);
      } catch (...) {  // a destructor must not throw; the arena goes with the backend anyway
      }
    }
    codes_ = nullptr, factors_ = nullptr, tally_ = nullptr;
  }

  CudaBackend& be_;
  int layers_;
  int64_t rows_, cols_, tiles_;  // tiles_: one layer's
  __nv_fp8_interpretation_t format_;
  fp8* codes_ = nullptr;
  float* factors_ = nullptr;
  char* tally_ = nullptr;  // DeviceScalars per layer, then the unrecorded casts', kFp8TallyBytes apart
};

std::unique_ptr<Fp8ActivationStore> CudaBackend::make_fp8_activation_store(int layers, int64_t rows, int64_t cols,
                                                                           Format format) {
  PTRAIN_EXPECT(is_fp8(format) && layers >= 1 && rows >= 1 && cols >= 1, "fp8_activation_store",
                "an fp8 format and a non-empty shape expected");
  return std::make_unique<CudaFp8ActivationStore>(*this, layers, rows, cols, format);
}

}  // namespace ptrain::cuda_impl
