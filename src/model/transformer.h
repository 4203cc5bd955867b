// A GPT-style decoder, written once against the Backend interface, in either architecture
// (model.arch). GPT-2: token + learned position embeddings, pre-LayerNorm blocks (causal
// multi-head attention, GELU MLP, biases), final LayerNorm, LM head tied to the token embedding.
// Llama: token embedding, pre-RMSNorm blocks (RoPE on q and k, grouped-query attention, SwiGLU
// MLP, no biases), final RMSNorm, LM head untied unless asked. The training loop, precision
// policy, FP8 linears and checkpoints are the same for both. Parameters are laid out as in llm.c
// (each tensor stacked over layers) in one buffer, gradients in a second buffer of the same
// layout (under ZeRO-2 grad buckets instead: MasterRange), activations in a third.
#pragma once

#include <algorithm>
#include <array>
#include <functional>
#include <memory>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "config/config.h"
#include "model/fp8_linear.h"
#include "model/param_layout.h"
#include "precision/policy.h"

namespace ptrain {

// Activation recomputation (training.recompute): what the forward pass keeps for each layer.
// none: everything the backward pass reads. mlp: not the MLP's hidden activations (4C, or
// SwiGLU's 3F, per token), which the backward pass recomputes from the saved norm output.
// block: only each block's output (the residual stream); the backward pass reruns the block's
// forward from its input first (Recompute, config/choices.h). The recomputed values are the same
// bits as the first pass's, so losses and gradients do not change.

// With every block's linears in FP8 for the whole run (`fp8_throughout`: every precision phase,
// no bf16 blocks, no bf16 fallback), the inputs those layers read backward only as their FP8 codes
// (ln1, ln2, the MLP's hidden activations) are kept for one layer at a time, as
// TransformerEngine saves an FP8 linear's input in FP8 and not beside a bf16 copy.
// With `mlp_input_codes` too (precision.fp8.mlp_input_codes, under recompute: none), the MLP's
// pre-activation (fch) is kept as FP8 codes (Fp8ActivationStore) in place of bf16, one layer of
// bf16 room serving them all (keeps_mlp_input_codes).

// Bytes of activation memory for micro-batch B and sequence length T, element size `elem`.
int64_t model_activation_bytes(const ModelShape& s, int B, int T, size_t elem, Recompute recompute = Recompute::none,
                               bool fp8_throughout = false, bool mlp_input_codes = false);
// The same for a backend that stores format f as storage(f), activations and their gradients
// in `act` and `grad`, attention by `attention`: the size of the one block Transformer allocates.
int64_t model_activation_bytes(const ModelShape& s, int B, int T, Format act, Format grad, AttentionPath attention,
                               const std::function<DType(Format)>& storage, Recompute recompute = Recompute::none,
                               bool fp8_throughout = false, bool mlp_input_codes = false);
// Whether a model keeps the MLP's pre-activation as FP8 codes: precision.fp8.mlp_input_codes,
// with every block FP8 for the whole run and nothing recomputed (the config refuses the key
// otherwise; recompute: mlp and block keep one layer of it anyway).
bool keeps_mlp_input_codes(const PrecisionPolicy& policy, Recompute recompute, bool fp8_throughout);

// The linear layers of a block, in order. FP8 telemetry calls them qkv, attproj, fc, fcproj
// (GPT-2) or qkv, o_proj, gate_up, down (llama).
enum LinearId { kQkv, kAttproj, kFc, kFcproj, kLinearsPerBlock };

// (C, OC) of a block's linears, in LinearId order.
std::array<std::array<int64_t, 2>, kLinearsPerBlock> block_linear_shapes(const ModelShape& s);
// Bytes of the FP8 cast copies a model allocates under `policy` (0 without FP8) on the CPU;
// under ZeRO-3 (`sharded_params`) primary FP8 weights' layers keep no weight copy.
int64_t gpt_fp8_buffer_bytes(const ModelShape& s, const PrecisionPolicy& policy, int B, int T,
                             bool sharded_params = false);
// Bytes of the RoPE angle table a llama model keeps for sequence length T (0 for GPT-2).
int64_t rope_table_bytes(const ModelShape& s, int T);
// The parameters that keep no copy in the policy's weight format: with
// precision.fp8.primary_weights the block linears' weights, whose FP8 codes are cast from the
// FP32 master (0 otherwise).
int64_t primary_fp8_weight_count(const ModelShape& s, const PrecisionPolicy& policy);
// Whether the FP8 block linears cast their weights from the room before every pass, into codes
// the layers of a shape share: under ZeRO-3 (`sharded_params`), whose rooms hold a block's
// weights only while a pass runs, unless they are primary FP8 weights (cast from the master
// once a step, each rank keeping its part's codes, gathered into code rooms for each pass).
bool fp8_weights_recast(const PrecisionPolicy& policy, bool sharded_params);
// A run of the flat parameter layout, [begin, begin + count).
struct FlatRange {
  int64_t begin = 0, count = 0;
};
// How many of f's elements lie in [begin, begin + count).
inline int64_t overlap(FlatRange f, int64_t begin, int64_t count) {
  return std::max<int64_t>(0, std::min(f.begin + f.count, begin + count) - std::max(f.begin, begin));
}
// Where each block linear's weight (stacked over the layers) lies in the flat layout, in
// LinearId order.
std::array<FlatRange, kLinearsPerBlock> block_linear_ranges(const ModelShape& s);
// How many of the flat layout's elements [begin, begin + count) are block linears' weights,
// per linear (LinearId order): with primary FP8 weights under ZeRO-3, the part of a rank's range
// kept as FP8 codes, the rest in the weight format.
std::array<int64_t, kLinearsPerBlock> block_linear_elements(const ModelShape& s, int64_t begin, int64_t count);
// ZeRO-3's weights on the rank whose range of the flat layout is [begin, begin + count): the
// elements it keeps in the weight format (`range`, then the `rooms` every bucket's weights are
// gathered into: two block rooms of `block_room` each, a block's weights in the first
// `block_weights`, then the head's and embeddings' unless they take the block rooms' turns,
// `in_block_rooms`, as their gradients do), and with primary FP8 weights (`primary_fp8`), per
// linear, the codes of its part of the range and of two rooms' layers: a block's room then
// holds its few other weights, and the head's and embeddings' take rooms of their own. The
// model allocates these; the memory plans count them.
struct Zero3Weights {
  int64_t range = 0, rooms = 0, block_room = 0, block_weights = 0;
  bool in_block_rooms = false;
  std::array<int64_t, kLinearsPerBlock> code_range{}, code_rooms{};
};
Zero3Weights zero3_weights(const ModelShape& s, bool primary_fp8, int64_t begin, int64_t count);
// The slot whose FP8 input codes a block linear shares with the other layers' (make_fp8_gemms'
// input_slot), or -1 for codes of its own: a linear whose input is cast again right before its
// backward pass can share them. Every linear of a recomputed block does; under recompute: mlp
// the MLP's two (the first's forward pass runs again, the second casts its recomputed input);
// and the attention's output projection always, from the attention output every layer keeps
// for the attention's backward pass; with `mlp_input_codes` the MLP's second, whose input is
// made again from the stored codes.
int fp8_input_slot(Recompute recompute, int linear, bool mlp_input_codes);

// The activation buffers of one micro-batch (forward results kept for backward, and the
// backward scratch). One allocation holds them all.
// W is the qkv width (3C for GPT-2), F the MLP's hidden width (4C for GPT-2; llama's fch holds
// SwiGLU's gate and up, 2F wide, and fch_gelu its product). Llama has no *_mean.
struct GptActivations {
  Tensor tokens, targets;            // (B,T) i32
  Tensor encoded;                    // (B,T,C)
  Tensor ln1, ln1_mean, ln1_rstd;    // (L,B,T,C), (L,B,T)
  Tensor qkv;                        // (L,B,T,W), q and k turned by RoPE (llama)
  Tensor qkv_raw, qk_rstd;           // llama with QK-norm: qkv before it (L,B,T,W); (L,B*T*(NH+KV)) FP32
  Tensor atty;                       // (L,B,T,C)
  Tensor att;                        // (L,B,NH,T,T) probabilities, or FP32 log-sum-exps (fused; saved_attention)
  Tensor attproj;                    // (1,B,T,C): added into the residual at once, never read backward
  Tensor residual2;                  // (L,B,T,C)
  Tensor ln2, ln2_mean, ln2_rstd;    // (L,B,T,C), (L,B,T)
  Tensor fch, fch_gelu;              // (L,B,T,4C); llama (L,B,T,2F), (L,B,T,F)
  Tensor fcproj;                     // (1,B,T,C), as attproj
  Tensor residual3;                  // (L,B,T,C)
  Tensor lnf, lnf_mean, lnf_rstd;    // (B,T,C), (B,T)
  Tensor logits;                     // (B,T,Vp), gradient in place after forward
  Tensor losses;                     // (B,T)
  // Backward scratch, reused by every layer.
  Tensor dresidual, dln, datty, dfch_gelu, dfch;  // (B,T,C) and fch_gelu's, fch's widths
  Tensor dqkv;                                    // (B,T,W)
  Tensor dqkv_raw;                                // (B,T,W), QK-norm's input gradient
};

// The FP32 master weights a model keeps (with a policy that has them): all, or under ZeRO-1 and
// 2 one contiguous range of the flat layout, [begin, begin + count), the other ranks keeping the
// rest. A sharded model never allocates the whole master block, not even while it starts: a
// load writes its range and stages the GEMMs' copy a piece at a time (load_weights), and the
// ranks cast primary FP8 weights a part each (AdamW::gather_primary_fp8_weights).
struct MasterRange {
  int64_t begin = 0, count = -1;  // count < 0: all of them
  // ZeRO-2: no parameter-sized gradient buffer. The backward pass writes each block's weight
  // gradients into a bucket of one block's size, the head's and the embeddings' into buckets of
  // their own (grad_bucket; GradBucketSizes says which rooms they take), and hands each bucket
  // to grads_done as it completes, which must sum it into the owners' shards before the
  // bucket is used again.
  bool grad_buckets = false;
  // ZeRO-3 (with grad buckets): the GEMMs' copy of the weights is kept for this range only; the
  // forward and backward passes ask for each block's weights (set_weight_gather) a block
  // before they read them, gathered into rooms laid out as the grad buckets (zero3_weights): a
  // block's into one of two rooms; the embeddings' (with block 0's) and the head's (final norm,
  // LM head; beside the last block) into theirs, once per forward pass. With primary FP8
  // weights the range's block linears are kept as FP8 codes, gathered into code rooms.
  bool sharded_params = false;
};


class Transformer {
 public:
  // Allocates parameters, gradients and activations for micro-batch B x T on the backend, in
  // the formats `policy` gives (FP32 master weights apart when the GEMMs read a lower format);
  // `attention` is the path Backend::choose_attention picked (it decides what attention saves);
  // `fused_gelu` (model.fused_gelu) lets the backend fold the MLP's GELU into the GEMMs beside
  // it (Backend::matmul_gelu_forward/backward) where those layers are not FP8; `recompute` is
  // training.recompute's choice (Recompute); `master_range` the master weights kept (MasterRange);
  // `fp8_throughout` that every block runs FP8 for the whole run (model_activation_bytes), so
  // that switch_fp8 never runs one in bf16; with it, policy.fp8.mlp_input_codes keeps the MLP's
  // pre-activation as FP8 codes (keeps_mlp_input_codes).
  Transformer(const ModelShape& shape, Backend& backend, DType dtype, int B, int T,
      const PrecisionPolicy& policy = PrecisionPolicy{}, AttentionPath attention = AttentionPath::fallback,
      bool fused_gelu = true, Recompute recompute = Recompute::none, MasterRange master_range = {},
      bool fp8_throughout = false);
  ~Transformer();
  Transformer(const Transformer&) = delete;
  Transformer& operator=(const Transformer&) = delete;

  // GPT-2 initialisation, for both architectures: N(0, std) with std 0.02 by default, residual
  // projections (attproj/o_proj, fcproj/down) scaled by 1/sqrt(2L), biases 0, norm weights 1,
  // padded vocabulary rows 0. Deterministic in `seed`.
  void init(uint64_t seed, double std = 0.02);

  // Runs the forward pass on inputs/targets (B*T token ids each) and returns the mean loss.
  // With dloss != 0 the classifier also leaves d(loss)/d(logits) * dloss in place for
  // backward(); dloss = 1 / (B*T*accumulation steps) gives the mean over the batch.
  double forward(const int32_t* inputs, const int32_t* targets, float dloss);
  // One training micro-batch that does not wait for the device: uploads inputs and targets,
  // runs the forward pass with loss gradient dloss and backward() (grads_done as there), and
  // leaves the sum of the B*T token losses in loss_sum, one f64 element in backend memory (the
  // mean loss forward() returns is that sum / (B*T)).
  void train_micro_batch(const int32_t* inputs, const int32_t* targets, float dloss, Tensor loss_sum,
                         const std::function<void(int block)>& grads_done = {});
  // From now on train_micro_batch runs each kind of micro-batch (its dloss and the FP8 layers'
  // host state) once as called, which warms the backend's caches, then records it
  // (Backend::record: a CUDA graph) and replays the recording. Micro-batches with grads_done
  // always run as called. Returns why recording cannot work here, or "" when it is on.
  std::string record_micro_batches();
  // Why recording stopped after it was switched on (a recording failed; micro-batches run as
  // called since), or "".
  const std::string& recording_failure() const { return recording_failure_; }
  // How many micro-batches ran as a replayed recording.
  int64_t replays() const { return replays_; }
  int seq_len() const { return T_; }
  // Incremental decoding with a KV cache, for sampling from sequence 0 of the micro-batch.
  // start_decoding runs the forward pass over tokens[0, length) (1 <= length <= seq_len) and
  // returns the logits (real vocabulary) at position length - 1, what sampling draws the next
  // token from; each decode_next(token) then puts `token` at the
  // next position and returns the logits there, computing that one position over the keys and
  // values the earlier ones left in the activation buffers (Backend::attention_decode): O(length)
  // per token instead of a forward pass over the window. The logits equal start_decoding's over
  // the same tokens up to rounding. Any other forward pass ends the decoding. Not with FP8
  // linears, whose casts are sized for the whole micro-batch, nor with Recompute::block, which
  // keeps no layer's keys and values. Llama's position is RoPE's angle at that row.
  std::vector<float> start_decoding(const int32_t* tokens, int length);
  std::vector<float> decode_next(int32_t token);
  // The logits (real vocabulary) at every position of one window of seq_len tokens, row after
  // row: what `eval --dump-logits` writes for comparison with another implementation.
  std::vector<float> window_logits(const int32_t* tokens);
  // How many positions the decoding holds (0: none; seq_len: full, decode_next refuses).
  int decoded_length() const { return decoded_; }
  // Adds this micro-batch's gradients into grads(). Requires forward() with dloss != 0.
  // `grads_done(b)`, if given, is called as soon as the gradients of bucket b in grads() are
  // final: first L (the final norm and an untied LM head: is_head_param), then each block l
  // from L-1 down to 0, then -1 (the embeddings, and a tied LM head): a data-parallel run
  // starts summing them across ranks while the backward pass goes on. With
  // grad buckets (MasterRange::grad_buckets) grads_done is required, and the gradients it is
  // handed are this micro-batch's alone, in grad_bucket(l).
  void backward(const std::function<void(int block)>& grads_done = {});
  // The gradient tensors that grads_done(block) reports as final.
  std::vector<Tensor> block_grads(int block) const;
  // Without grad buckets, zeroes the gradients before a step's first micro-batch (with them the
  // buckets are zeroed as the backward pass reaches them).
  void zero_grad();
  bool has_grad_buckets() const { return grad_buckets_; }
  // ZeRO-3 (MasterRange::sharded_params): `start(b)` begins filling weight_room(b) with the
  // weights of weight_room_ranges(b) (a block l, the head L, the embeddings -1), in the weight
  // format, and a block's code rooms with its primary FP8 weights' codes; after `wait()`, what the model queues next sees every gather started so far. Every
  // rank's model calls them at the same points of its forward and backward passes, one block
  // ahead: the next block's gather starts before this block computes and runs beside it on GPUs.
  struct WeightGather {
    std::function<void(int bucket)> start;
    std::function<void()> wait;
  };
  bool has_sharded_params() const { return sharded_params_; }
  void set_weight_gather(WeightGather gather) { weight_gather_ = std::move(gather); }
  // Where bucket b's weights are gathered, in the weight format: the flat layout's
  // weight_room_ranges(b), in that order (grad_bucket_ranges(b) but for primary FP8 weights).
  Tensor weight_room(int bucket) const;
  std::vector<FlatRange> weight_room_ranges(int bucket) const;
  // With primary FP8 weights under ZeRO-3, block `layer`'s linear `linear` (LinearId) gathers
  // its weight's FP8 codes into code_room(layer, linear) (one of two rooms per linear, used by
  // the blocks in turn) from the ranks' codes of primary_layer_range(layer, linear); empty
  // otherwise.
  Tensor code_room(int layer, int linear) const;
  FlatRange primary_layer_range(int layer, int linear) const;
  // This rank's copy (weight format) and, with primary FP8 weights, codes of flat elements
  // `f`, a run inside this rank's range and inside one tensor (ZeRO-3: params_flat() keeps
  // the rest of the range, its other tensors', in order, and each linear's codes are apart).
  Tensor range_copy(FlatRange f) const;
  Tensor range_codes(FlatRange f) const;
  // With grad buckets: bucket b (grads_done's), FP32, its elements the flat layout's
  // grad_bucket_ranges(b), in that order (ascending).
  Tensor grad_bucket(int bucket) const;
  std::vector<FlatRange> grad_bucket_ranges(int bucket) const;
  // After each optimizer step: FP8 delayed scales move on and weights are cast afresh.
  void end_step();
  // The step in progress is given up before its update (a stop request between micro-batches):
  // the FP8 scaling state forgets its casts, so it is the last completed step's again.
  void abandon_step();
  // A precision schedule's switch: the FP8 linears of the old policy, their casts and scaling
  // state, are dropped, and `policy`'s made afresh (none without FP8). The policy must store
  // weights, activations and gradients as the model's did (bf16 <-> fp8): every other buffer
  // stays as it is. Recordings are dropped; returns why micro-batches now run as called when
  // recording was asked for, else "".
  std::string switch_fp8(const PrecisionPolicy& policy);
  // The FP8-cast tensors (empty unless the policy runs FP8 GEMMs).
  std::vector<Fp8TensorState*> fp8_tensors();
  // fp8_tensors(), then with the MLP's input kept as FP8 codes each layer's store (its
  // statistics only: block-scaled, no scale of its own), for the numerics log.
  std::vector<Fp8TensorState*> numerics_tensors();
  // For the run log: how many FP8 linears run native FP8 GEMMs, and why the others emulate;
  // with primary FP8 weights, says so; empty without FP8.
  std::string fp8_gemm_summary() const;
  // The weights whose GEMMs run native FP8 (an emulated FP8 linear runs at the other GEMMs'
  // rate): times 6 FLOPs per token, the FP8 part of the training FLOPs for MFU's mixed peak.
  int64_t native_fp8_weights() const;

  const ModelShape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  Backend& backend() const { return backend_; }
  const std::vector<ParamSpec>& specs() const { return specs_; }
  // The weights the GEMMs read: the copy in the policy's weight format, or with primary FP8
  // weights (precision.fp8.primary_weights) for the block linears the FP32 master their FP8
  // codes are cast from (with a sharded master, whose ranks cast a part each, its shape with no
  // memory). Empty for a tensor this architecture lacks.
  Tensor param(ParamId id) const { return params_[id]; }
  // The copy the optimizer writes after updating the FP32 master: param(id) where it is kept
  // apart from the master, else empty (FP32 training, primary FP8 weights).
  // Under ZeRO-3 the optimizer writes the rank's range of params_flat() instead (range_copy).
  Tensor weight_copy(ParamId id) const { return has_master_ && !is_primary_fp8(id) ? params_[id] : Tensor(); }
  // The gradients the optimizer reads, summed over the micro-batches since zero_grad(): FP32 in
  // every mode (Megatron's main_grad), one parameter-sized buffer (with grad buckets only the
  // embeddings' and head's tensors are here, each micro-batch's own). The backward ops add each
  // micro-batch's weight gradients into it directly (a GPU's weight-gradient GEMMs with FP32
  // C/D and beta 1, Megatron's gradient accumulation fusion), so no narrower copy of a
  // gradient is kept: only activation gradients take the policy's gradient format.
  Tensor grad(ParamId id) const { return grads_[id]; }
  // The copies in the policy's weight format, in the flat layout (all parameters unless
  // primary FP8 weights keep none of the block linears'; under ZeRO-3 this rank's range only).
  Tensor params_flat() const { return params_flat_; }
  // The weights as the optimizer and a checkpoint read them: the whole FP32 master weights, or
  // the parameters themselves in FP32; with a sharded master, the GEMMs' copy (the FP32 values
  // are in master_shard()), which primary FP8 weights do not keep whole: then empty.
  Tensor master_flat() const {
    if (sharded_params_) return Tensor();
    if (sharded_master_) return primary_fp8_ ? Tensor() : params_flat_;
    return master_flat_.empty() ? params_flat_ : master_flat_;
  }
  // Tensor id's FP32 master weights; with a sharded master (which has no whole tensor), param(id).
  Tensor master(ParamId id) const;
  // New weights (init, model.init_from, a checkpoint's): tensor id's FP32 values, elements
  // [begin, begin + count) of it (all of it by default) from host memory. Unsharded they go to
  // master(); with a sharded master this rank's range of them goes to master_shard() and the
  // GEMMs' copy is written through a staging
  // buffer, a piece at a time (the gradient buffer, free between steps, or the grad buckets),
  // so the whole FP32 master is never held. Call weights_loaded() once all are written. Not
  // while a step's gradients are there.
  void load_weights(ParamId id, const float* host, int64_t begin = 0, int64_t count = -1);
  // After load_weights, or after master() was written unsharded: refresh the copy the GEMMs
  // read from the master where that is kept apart. Primary FP8 weights are cast afresh before
  // the next forward pass (primary_fp8_cast_due).
  void weights_loaded();
  // Primary FP8 weights (precision.fp8.primary_weights) are cast from the FP32 master before
  // the forward pass that needs them, outside any recording: once per step as the step's
  // training cast (its statistics count in the step's, as a cast in the forward pass would),
  // due after each step (end_step) and after new weights were written; and by an evaluation
  // that finds them stale, as an evaluation's cast that records nothing (so evaluations leave
  // the scaling state as they find it). Unsharded, forward() and train_micro_batch() cast from
  // the master themselves; under ZeRO-1 to 3 each rank casts its part of every layer, and the
  // ranks gather the codes (ZeRO-1 and 2) or each keeps its part's for the passes to gather
  // (ZeRO-3) (AdamW::gather_primary_fp8_weights, through primary_fp8_layers).
  bool primary_fp8_weights() const { return primary_fp8_; }
  // Whether tensor id's working weights are primary FP8 weights (param() is the master, or with
  // a sharded master the master's shape only).
  bool is_primary_fp8(ParamId id) const { return primary_fp8_ && is_block_linear(id); }
  // Whether a training forward pass (`training`), or an evaluation, must cast them first.
  bool primary_fp8_cast_due(bool training) const {
    return primary_fp8_ && (training ? primary_cast_ != PrimaryCast::done : primary_cast_ == PrimaryCast::due);
  }
  // Casts the block linears' weights (training or evaluation cast) from `full_master`, the whole
  // FP32 master in the flat layout.
  void cast_primary_fp8_weights(Tensor full_master, bool training);
  // Each block linear's FP8 layer with primary FP8 weights, and where its layer's weight lies in
  // the flat layout: what the ranks cast a part each under ZeRO-1 to 3 (Fp8Linear::
  // weight_part_amaxes and on), saying so with finish_primary_fp8_cast once all are cast.
  struct PrimaryFp8Layer {
    Fp8Linear* fp8;
    FlatRange range;
  };
  std::vector<PrimaryFp8Layer> primary_fp8_layers() const;
  void finish_primary_fp8_cast(bool training);
  // Whether the FP32 master weights are kept apart from the copy the GEMMs read (bf16, fp16, fp8).
  bool has_master_weights() const { return has_master_; }
  // ZeRO-1: this rank's range of the FP32 master weights (MasterRange); empty when unsharded.
  Tensor master_shard() const { return sharded_master_ ? master_flat_ : Tensor(); }
  // The parameter-sized gradient buffer; empty with grad buckets.
  Tensor grads_flat() const { return grads_flat_; }
  int64_t num_params() const { return num_params_; }
  size_t activation_bytes() const { return act_bytes_; }

 private:

  // Bucket b's place in the grad buckets' memory, or (with the block rooms' size) the weight
  // rooms'; its elements; turn's block room's offset.
  int64_t bucket_at(int bucket, int64_t block_room, bool in_block_rooms) const;
  int64_t grad_bucket_at(int bucket) const {
    return bucket_at(bucket, bucket_sizes_.block, bucket_sizes_.in_block_rooms);
  }
  int64_t weight_room_at(int bucket) const { return bucket_at(bucket, room_block_, weights_in_block_rooms_); }
  int64_t bucket_numel(int bucket) const;
  // The flat layout's ranges of bucket b's tensors, in order; `without_codes`: but for the
  // primary FP8 weights (grad_bucket_ranges, weight_room_ranges).
  std::vector<FlatRange> bucket_ranges(int bucket, bool without_codes) const;
  // Elements of the primary FP8 weights in this rank's range before flat element `at`.
  int64_t primary_before(int64_t at) const;
  // After the FP8 linears are made: ZeRO-3's codes of primary FP8 weights, each linear's
  // (this rank's part, and two rooms), in the dtype its layers' GEMMs read.
  void allocate_code_rooms(const Zero3Weights& zero3);
  Tensor residual_in(int layer) const;
  Tensor saved_attention(int layer) const;  // what attention keeps for its backward: (B,NH,T,T) or (B,NH,T)
  void load_batch(const int32_t* inputs, const int32_t* targets);
  void forward_logits(bool training) { forward_pass(-1, training); }  // on the loaded inputs
  // The forward pass to the logits over the whole micro-batch (position < 0), or at `position`
  // of sequence 0 alone, its attention over the positions before it (decoding).
  void forward_pass(int position, bool training);
  void block_forward(int layer, int position, bool training);
  void gpt2_block_forward(int layer, int position, bool training);
  void llama_block_forward(int layer, int position, bool training);
  // The MLP up to its hidden activations (fc and GELU, or gate_up and SwiGLU), from ln2.
  void mlp_hidden_forward(int layer, int position, bool training);
  void mlp_activation(Tensor hidden, Tensor fch);  // SwiGLU or GELU
  // Under recompute: mlp, the MLP's hidden activations again before its backward pass, and the
  // FP8 input codes of both its linears (which share a slot with the other layers').
  void recompute_mlp(int layer);
  // With the MLP's pre-activation stored as FP8 codes: the pre-activation's values and the
  // hidden activations again before the MLP's backward pass, and the second linear's input codes.
  void mlp_hidden_from_codes(int layer);
  // Which stored layer of a per-layer activation holds layer l's: l, or 0 when recomputed.
  int block_slot(int layer) const { return recompute_ == Recompute::block ? 0 : layer; }
  int mlp_slot(int layer) const { return recompute_ == Recompute::none ? layer : 0; }
  // Which stored layer holds layer l's ln1, ln2 and MLP hidden activations: 0 when FP8 layers
  // read them backward as codes only (fp8_throughout_; ln2 per layer when the MLP is recomputed
  // from it).
  int ln1_slot(int layer) const { return fp8_throughout_ ? 0 : block_slot(layer); }
  int ln2_slot(int layer) const {
    return fp8_throughout_ && recompute_ == Recompute::none ? 0 : block_slot(layer);
  }
  int hidden_slot(int layer) const { return fp8_throughout_ ? 0 : mlp_slot(layer); }
  // The pre-activation's: 0 when its values come from the FP8 store.
  int fch_slot(int layer) const { return mlp_inputs_ ? 0 : mlp_slot(layer); }
  void gpt2_block_backward(int layer);
  void llama_block_backward(int layer);
  // Block `layer`'s gradient of tensor id: its slice of grad(id), or its place in the bucket.
  Tensor block_grad(ParamId id, int layer) const;
  // Block tensor id's place in a block bucket's room (or in values staged the same way), shaped
  // as one layer of it, at `offsets` (bucket_offsets_, or room_offsets_ for weight rooms).
  Tensor layer_of(Tensor bucket, ParamId id, const std::array<int64_t, kNumParams>& offsets) const;
  // Block `layer`'s weights of tensor id: param(id)'s slice, or under ZeRO-3 its place in the
  // weight room that holds the layer.
  Tensor block_param(ParamId id, int layer) const;
  // ZeRO-3: start the gather of a bucket's weights; wait for those started so far. No-ops else.
  void start_weights(int bucket);
  void await_weights();
  // t (B,T,...) whole (position < 0), or position `position` of sequence 0 as a (1,1,width) row.
  Tensor rows_at(Tensor t, int position) const;
  void attention_forward(int layer, int position);  // whole, or one decoded row over the cache
  Tensor rope_rows(int position) const;             // the RoPE table, or its row at `position`
  Tensor lm_head() const;                           // wte when tied
  void check_tokens(const int32_t* ids, int64_t n, const char* what) const;
  std::vector<float> logits_at(int position) const;  // sequence 0's, the real vocabulary
  void forward_loss(float dloss);                // forward_logits and the classifier
  void forward_and_backward(float dloss, const std::function<void(int block)>& grads_done);
  void run_recorded(float dloss);                // forward_and_backward, recorded or replayed
  // The host state that a recorded micro-batch depends on and changes.
  struct HostProgress {
    uint32_t dloss_bits = 0;
    bool grads_ready = false;
    std::vector<Fp8Linear::HostState> fp8;  // per fp8_ entry
    bool operator==(const HostProgress& o) const {
      return dloss_bits == o.dloss_bits && grads_ready == o.grads_ready && fp8 == o.fp8;
    }
  };
  HostProgress host_progress(float dloss) const;
  void restore(const HostProgress& progress);
  void make_fp8_linears(const PrecisionPolicy& policy);  // fp8_ for the policy
  Fp8Linear* fp8_linear(int layer, LinearId which) const;  // null: this linear runs in bf16/fp32
  Fp8Linear* lm_head_fp8() const;
  void queue_fp8_settle();  // every FP8 layer's statistics on their way, for one wait
  void cast_due_primary_weights(bool training);  // unsharded: from the master, when primary_fp8_cast_due
  void linear_forward(Fp8Linear* fp8, Tensor out, Tensor inp, Tensor weight, Tensor bias, bool training);
  void linear_backward(Fp8Linear* fp8, Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp,
                       Tensor weight);

  ModelShape shape_;
  Backend& backend_;
  DType dtype_;
  int B_, T_;
  std::vector<ParamSpec> specs_;
  std::array<Tensor, kNumParams> params_, grads_;
  std::array<int64_t, kNumParams> offsets_{};  // each tensor's place in the flat layout
  std::array<bool, kNumParams> present_{};     // the tensors this architecture has
  Tensor params_flat_, grads_flat_, master_flat_;
  int64_t num_params_ = 0;
  // Grad buckets (MasterRange::grad_buckets): one allocation, the block bucket, then the
  // embeddings' and the head's (GradBucketSizes); each block tensor's place in the block bucket.
  bool grad_buckets_ = false;
  GradBucketSizes bucket_sizes_;  // grad_bucket_sizes(shape_), read on every bucket access
  Tensor bucket_memory_;
  bool sharded_params_ = false;  // ZeRO-3: params_flat_ holds master_begin_.. of the copy only (range_copy)
  // ZeRO-3 with primary FP8 weights: the range's block linears are kept as codes (code_ranges_)
  // and gathered into code_rooms_, so params_flat_ and the weight rooms leave them out.
  bool codes_in_rooms_ = false;
  Tensor weight_rooms_;          // laid out as bucket_memory_ (weight_room_at), blocks' rooms room_block_ long
  int64_t block_room_weights_ = 0;  // a block's weights in its room: bucket_sizes_.block less linears kept as codes
  int64_t room_block_ = 0;  // a block room's length: that, or a grad bucket's where the head's and embeddings' take turns
  bool weights_in_block_rooms_ = false;  // ... as they do then (Zero3Weights::in_block_rooms)
  std::array<FlatRange, kLinearsPerBlock> linear_ranges_{};  // block_linear_ranges(shape_)
  std::array<Tensor, kLinearsPerBlock> code_ranges_, code_rooms_;
  WeightGather weight_gather_;
  std::array<int64_t, kNumParams> bucket_offsets_{}, room_offsets_{};
  std::vector<std::unique_ptr<Fp8Linear>> fp8_;  // [layer * kLinearsPerBlock + LinearId], then the LM head
  AttentionPath attention_;
  bool fused_gelu_;
  Recompute recompute_;
  bool fp8_throughout_;  // every block FP8 for the whole run: see ln1_slot
  std::unique_ptr<Fp8ActivationStore> mlp_inputs_;  // the MLP's pre-activation as FP8 codes, per layer
  std::vector<Fp8TensorState> mlp_input_stats_;     // its casts' statistics, per layer
  std::array<Format, 3> formats_;  // weights, activations, gradients: what switch_fp8 keeps
  bool has_master_ = false;
  bool primary_fp8_ = false;  // precision.fp8.primary_weights
  // Primary FP8 weights' codes: stale (due), current from an evaluation's cast with the step's
  // training cast still due (evaluated), or the step's training cast made (done).
  enum class PrimaryCast { due, evaluated, done } primary_cast_ = PrimaryCast::due;
  bool sharded_master_ = false;  // master_flat_ holds master_begin_.. of the flat layout only
  int64_t master_begin_ = 0;     // where this rank's range begins (sharded)
  GptActivations a_;
  Tensor rope_table_;  // llama: (T, head_size/2, 2) FP32 cos and sin
  std::vector<std::string> block_names_;  // "block 0", ...: NVTX range names
  size_t act_bytes_ = 0;
  void* act_memory_ = nullptr;
  bool grads_ready_ = false;
  int decoded_ = 0;  // positions of sequence 0 that decoding holds
  // Recorded micro-batches, by the host state they start from.
  struct Recording {
    HostProgress before, after;
    uint64_t memory_epoch = 0;  // the backend's when made; another means memory moved since
    std::unique_ptr<RecordedWork> work;  // null until the kind has run once as called
  };
  void replay(Recording& recording);
  bool recording_on_ = false;
  bool recording_asked_ = false;  // record_micro_batches() was called
  std::string recording_failure_;
  std::vector<Recording> recordings_;
  int64_t replays_ = 0;
};

}  // namespace ptrain
