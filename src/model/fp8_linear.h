// The FP8 path of one linear layer, TransformerEngine style: the input and the weight are cast
// to the forward format (E4M3), the output gradient to the backward format (E5M2 for hybrid),
// each with its own scale from the recipe; the GEMMs then run on the cast values with FP32
// accumulation. The weight is cast once per optimizer step and reused by every micro-batch
// (or, for a layer that recasts it, cast again before each pass: the same codes each time);
// the cast input is kept for the weight-gradient GEMM; the bias gradient is taken from the
// unquantised output gradient. Block scaling tiles along each GEMM's contraction dimension, as
// Hopper's block-scaled GEMMs need: 1x128 tiles of input and gradient for fprop and dgrad,
// 128x1 tiles of both for wgrad (which contracts over tokens), 128x128 blocks of the weight.
// On a backend with native FP8 GEMMs (Backend::make_fp8_gemms) the casts produce FP8 codes that
// the GEMMs read directly (per-tensor scale pointers, or Hopper's block-scaled modes for the
// block recipe with 128-element blocks); elsewhere the casts produce dequantised values and the
// backend's ordinary GEMMs multiply them (the CPU's emulation).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "precision/fp8_scaling.h"
#include "precision/policy.h"

namespace ptrain {

// One FP8-cast tensor's scaling state and what its casts did since telemetry last read it.
struct Fp8TensorState {
  std::string name;  // e.g. "h3.fc.input"
  Format format;
  DelayedScaling delayed;
  float scale = 1;         // scale of the latest training cast (per-tensor recipes; NaN for block)
  Fp8CastStats stats;      // amax is the max over the casts since the last reset
  void reset_stats() { stats = Fp8CastStats{}; }
};

class Fp8Linear {
 public:
  // A linear layer with `rows` input rows per micro-batch, C inputs and OC outputs. `input_slot`
  // >= 0: native FP8 GEMMs may share the cast input with the other layers of the slot
  // (Backend::make_fp8_gemms), for a layer whose input is cast again before its backward pass
  // (by its forward pass run again, or by recast_input).
  // `weight` says where the weight's codes come from (Weight).
  enum class Weight {
    cast_once,  // cast from the weight forward() is handed, once a step, into codes of its own
    // cast afresh by every forward() and backward(), from the weight each is handed, into codes
    // the native GEMMs share with the other such layers of its shape (ZeRO-3, whose rooms hold a
    // block's weights only while its passes run): one block's codes instead of every layer's
    recast,
    // a primary FP8 weight (precision.fp8.primary_weights), cast from the FP32 master by
    // cast_weight() or in parts (encode_weight_part), never by forward()
    primary,
    // a primary FP8 weight whose codes the layer does not keep: the ranks encode their parts
    // elsewhere (ZeRO-3, each rank keeping its part's codes), and forward() and backward() are
    // handed the whole layer's codes (gathered into a room), weight_code_dtype() elements
    primary_handed,
  };
  Fp8Linear(const std::string& name, const Fp8Policy& policy, Backend& backend, int64_t rows, int64_t C,
            int64_t OC, int input_slot = -1, Weight weight = Weight::cast_once);
  ~Fp8Linear();
  Fp8Linear(const Fp8Linear&) = delete;
  Fp8Linear& operator=(const Fp8Linear&) = delete;

  // out(rows, OC) = fp8(inp) fp8(weight)^T + bias (bias may be empty). `training` false (an
  // evaluation) leaves the scaling state and telemetry untouched.
  void forward(Tensor out, Tensor inp, Tensor weight, Tensor bias, bool training);
  // The input's codes again right before backward(), from the values forward() cast (kept, or
  // recomputed bit for bit), where they sit in a slot shared with other layers
  // (shares_input_codes()): the same codes, their statistics not counted a second time. A
  // layer whose codes are its own still has them, and does nothing.
  void recast_input(Tensor inp);
  bool shares_input_codes() const { return gemms_ && input_slot_ >= 0; }
  // Gradients of the latest forward(): dinp += fp8(dout) fp8(weight); dweight += fp8(dout)^T
  // fp8(inp); dbias += column sums of dout. `weight` is read only by a layer that recasts it or
  // is handed its codes, and must be what forward() was handed.
  void backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor weight);
  // A primary weight's cast from `master` (OC, C): the training cast of the step to come, its
  // statistics counting in that step's as a cast in forward() would; or (`training` false) an
  // evaluation's, which leaves the scaling state and telemetry untouched.
  void cast_weight(Tensor master, bool training);
  // A primary weight's cast shared out over ranks (ZeRO-1 to 3), each casting its part of the
  // FP32 master with the scales the ranks agree on, the codes then all-gathered into
  // weight_codes() (or, for a layer handed its codes, kept by each rank and gathered by the
  // passes): the codes, scales and statistics cast_weight() of the whole would make. On every
  // rank, in order: weight_part_amaxes for this rank's part (elements [first, first +
  // part.numel()) of the (OC, C) weight) into weight_amax_count() zeroed floats, of which the
  // caller takes the ranks' maxima (NaN winning); agree_weight_scales with those; then
  // encode_weight_part; once the codes are cast (and gathered), finish_weight_cast with the
  // parts' statistics summed over ranks.
  int64_t weight_amax_count() const;  // the tensor's amax, then with block scaling each block's
  void weight_part_amaxes(Tensor part, int64_t first, float* amaxes);
  void agree_weight_scales(const float* amaxes, bool training);
  Tensor weight_codes() const;  // (OC * C): u8 codes, or dequantised values where emulated
  Fp8CastStats encode_weight_part(Tensor part, int64_t first);
  // The same, into `codes` (part.numel() elements of weight_code_dtype()) where the layer is
  // handed its codes (Weight::primary_handed).
  Fp8CastStats encode_weight_part(Tensor part, int64_t first, Tensor codes);
  // What its weight's codes are stored as: u8 for native GEMMs, else dequantised f32 values.
  DType weight_code_dtype() const { return gemms_ ? DType::u8 : DType::f32; }
  void finish_weight_cast(const Fp8CastStats& all_parts, bool training);
  // After each optimizer step: delayed scales move on, the weight is cast afresh next step (a
  // primary weight by cast_weight()).
  void end_step();
  // A step given up before its update: what its casts recorded is forgotten, so the scaling
  // state is the previous step's again (as its checkpoint holds it).
  void abandon_step();

  // The three tensors' scaling states and telemetry, with the native casts' statistics read
  // from the device first (settle()). Call it again rather than keep the pointers across casts:
  // what they point to is current only after a settle.
  std::vector<Fp8TensorState*> tensors() {
    settle();
    return {&input_, &weight_, &grad_};
  }
  // Starts reading the native casts' statistics back without waiting (Fp8Gemms::queue_stats_read):
  // call it on every layer before tensors() or end_step() on any, for one wait in all.
  void queue_settle() {
    if (unsettled_) gemms_->queue_stats_read();
  }
  // Whether the GEMMs read FP8 codes directly; if not, native_fp8_absent() says why.
  bool native() const { return gemms_ != nullptr; }
  const std::string& native_fp8_absent() const { return why_emulated_; }
  int64_t weights() const { return weights_; }  // OC x C
  const std::string& weight_name() const { return weight_.name; }

  // What the host keeps between a layer's calls: whether this step's weight cast is done and
  // whether native casts left statistics on the device. A recorded micro-batch (CUDA graph)
  // replays the device work only, so its caller sets these to what the recording left.
  struct HostState {
    bool weight_cast = false, unsettled = false;
    bool operator==(const HostState& o) const { return weight_cast == o.weight_cast && unsettled == o.unsettled; }
  };
  HostState host_state() const { return {weight_cast_, unsettled_}; }
  void restore(const HostState& s) {
    weight_cast_ = s.weight_cast;
    unsettled_ = s.unsettled;
  }
  // Why a recorded training micro-batch would not replay this layer's casts as they run
  // anew, or "" when it would.
  std::string unrecordable() const;

  // Bytes of the cast copies one such layer allocates.
  static int64_t buffer_bytes(const Fp8Policy& policy, int64_t rows, int64_t C, int64_t OC,
                              Weight weight = Weight::cast_once);
  // The only block size block-scaled GEMMs take (cuBLASLt's VEC128 / BLK128x128 modes).
  static constexpr int kNativeBlock = 128;

 private:
  void cast(Fp8TensorState& state, Fp8Gemms::Operand operand, Tensor out, Tensor in, int block_rows, int block_cols,
            bool training);
  // The input's casts: for the forward GEMM, and with block scaling for wgrad when `wgrad`.
  void cast_input(Tensor inp, bool training, bool wgrad);
  void* allocate_like(Tensor& slot, const std::vector<int64_t>& shape);
  void take_handed_codes(Tensor codes);  // Weight::primary_handed: what the GEMMs read next
  // Native casts gather their statistics on the device (no wait per cast); this reads them into
  // the states (telemetry, and the delayed recipe's amax history) once they are needed.
  void settle();

  Fp8Policy policy_;
  Backend& backend_;
  int64_t weights_, C_, OC_;
  Fp8TensorState input_, weight_, grad_;
  std::vector<float> weight_scales_;  // agree_weight_scales's: one, or one per block
  float weight_amax_ = 0;             // and the whole weight's amax
  Tensor input_q_, weight_q_, grad_q_;  // dequantised FP8 values, (rows, C), (OC, C), (rows, OC)
  Tensor input_qt_, grad_qt_;           // block recipe: 128x1 tiles for wgrad, (rows, C), (rows, OC)
  std::vector<void*> memory_;
  std::unique_ptr<Fp8Gemms> gemms_;  // native FP8 GEMMs, or null: emulated through the q buffers
  std::string why_emulated_;
  int input_slot_;
  Weight weight_mode_;
  bool primary_weight() const { return weight_mode_ == Weight::primary || weight_mode_ == Weight::primary_handed; }
  bool weight_cast_ = false;
  bool unsettled_ = false;  // native casts recorded statistics on the device since settle()
};

}  // namespace ptrain
