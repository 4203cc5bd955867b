// Activations kept for the backward pass as FP8 codes (precision.fp8.mlp_input_codes): the MLP's
// pre-activation, `layers` tensors of rows x cols, each row in 1 x kFp8StoreTile tiles with a
// scale fp8_max / amax(tile), as DeepSeek-V3 caches the SwiGLU input (arXiv 2412.19437, §3.3.3).
// The model reads the values back (load) in the forward pass too, so the activation function
// sees the same values forward and backward.
#pragma once

#include <cstdint>
#include <vector>

#include "config/choices.h"
#include "core/tensor.h"

namespace ptrain {

class Backend;
struct Fp8CastStats;

// The tile width: the block recipe's activation tiles.
constexpr int kFp8StoreTile = 128;

class Fp8ActivationStore {
 public:
  virtual ~Fp8ActivationStore() = default;
  // Layer `layer`'s codes and scales from `in` (rows x cols, any float storage); with `record`
  // (training), the cast's statistics count in the layer's (take_stats).
  virtual void store(int layer, Tensor in, bool record) = 0;
  // `out` (rows x cols) = layer `layer`'s dequantised values (code / scale), rounded to out's
  // format as any op's output.
  virtual void load(int layer, Tensor out) = 0;
  // Each layer's statistics of the recorded stores since the last take (amax, values that
  // underflowed to zero), and they start afresh.
  virtual std::vector<Fp8CastStats> take_stats() = 0;
};

// The store of a backend with no FP8 storage of its own (the CPU's): the dequantised values in
// f32 blocks, through Backend::fp8_cast_blocks and copy, so the values equal a real store's.
class EmulatedFp8ActivationStore final : public Fp8ActivationStore {
 public:
  EmulatedFp8ActivationStore(Backend& backend, int layers, int64_t rows, int64_t cols, Format format);
  ~EmulatedFp8ActivationStore() override;
  EmulatedFp8ActivationStore(const EmulatedFp8ActivationStore&) = delete;
  EmulatedFp8ActivationStore& operator=(const EmulatedFp8ActivationStore&) = delete;
  void store(int layer, Tensor in, bool record) override;
  void load(int layer, Tensor out) override;
  std::vector<Fp8CastStats> take_stats() override;

 private:
  Backend& backend_;
  Format format_;
  Tensor values_;  // (layers, rows, cols) f32
  std::vector<Fp8CastStats> stats_;  // per layer
};

}  // namespace ptrain
