#include "backend/fp8_activation_store.h"

#include "backend/backend.h"
#include "core/error.h"
#include "precision/formats.h"

namespace ptrain {

EmulatedFp8ActivationStore::EmulatedFp8ActivationStore(Backend& backend, int layers, int64_t rows, int64_t cols,
                                                       Format format)
    : backend_(backend), format_(format) {
  PTRAIN_CHECK(is_fp8(format) && layers >= 1 && rows >= 1 && cols >= 1, "an FP8 activation store's shape or format");
  const int64_t n = int64_t{layers} * rows * cols;
  values_ = Tensor(backend.allocate(static_cast<size_t>(n) * sizeof(float)), DType::f32, {layers, rows, cols},
                   backend.device());
  stats_.resize(static_cast<size_t>(layers));
}

EmulatedFp8ActivationStore::~EmulatedFp8ActivationStore() { backend_.release(values_.data); }

void EmulatedFp8ActivationStore::store(int layer, Tensor in, bool record) {
  const Tensor slot = values_[layer];
  PTRAIN_CHECK(in.numel() == slot.numel(), "an FP8 activation store's layer and its input differ in size");
  const Fp8CastStats s = backend_.fp8_cast_blocks(slot, in, format_, 1, kFp8StoreTile);
  if (record) stats_[static_cast<size_t>(layer)].merge(s);
}

std::vector<Fp8CastStats> EmulatedFp8ActivationStore::take_stats() {
  std::vector<Fp8CastStats> taken(stats_.size());
  taken.swap(stats_);
  return taken;
}

void EmulatedFp8ActivationStore::load(int layer, Tensor out) {
  const Tensor slot = values_[layer];
  PTRAIN_CHECK(out.numel() == slot.numel(), "an FP8 activation store's layer and its output differ in size");
  backend_.copy(out, slot);
}

std::unique_ptr<Fp8ActivationStore> Backend::make_fp8_activation_store(int layers, int64_t rows, int64_t cols,
                                                                       Format format) {
  return std::make_unique<EmulatedFp8ActivationStore>(*this, layers, rows, cols, format);
}

}  // namespace ptrain
