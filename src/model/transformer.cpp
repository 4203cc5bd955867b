#include "model/transformer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "backend/nvtx.h"
#include "model/rope_table.h"

namespace ptrain {

// The activation buffers of one micro-batch, in allocation order, with the number format each
// holds. Used both to size the allocation (dry-run estimate) and to carve it.
namespace {
struct ActivationPlan {
  struct Entry {
    Tensor* slot;
    std::vector<int64_t> shape;
    DType dtype;
    Format format;
  };
  std::vector<Entry> entries;
  int64_t bytes() const {
    int64_t total = 0;
    for (const auto& e : entries) total += (shape_numel(e.shape) * dtype_size(e.dtype) + 63) / 64 * 64;
    return total;
  }
};

// Activations and their gradients take the policy's formats; norm statistics and the per-token
// losses stay FP32, as in every mixed-precision recipe. `storage` maps a format to the backend's
// storage dtype. Llama's RMSNorms save no mean; its MLP buffers are the SwiGLU's (gate and up
// side by side in fch, the product in fch_gelu).
// Recomputed activations keep one layer's room, which every layer's forward pass overwrites. So
// do, with `fp8_throughout`, the linear inputs that FP8 layers read backward as their codes
// only: ln1, and unless the MLP is recomputed from it, ln2 and the MLP's hidden activations;
// with `mlp_input_codes`, the MLP's pre-activation, whose values the FP8 store keeps.
template <typename Storage>
ActivationPlan plan_activations(GptActivations& a, const ModelShape& s, int B, int T, Format act, Format grad,
                                AttentionPath attention, Storage storage, Recompute recompute, bool fp8_throughout,
                                bool mlp_input_codes) {
  const int64_t L = recompute == Recompute::block ? 1 : s.n_layer, Lm = recompute == Recompute::none ? L : 1;
  const int64_t L_ln1 = fp8_throughout ? 1 : L, L_ln2 = fp8_throughout && recompute == Recompute::none ? 1 : L,
                L_hidden = fp8_throughout ? 1 : Lm;
  const int64_t C = s.n_embd, NH = s.n_head, W = s.qkv_width();
  const bool llama = s.arch == Arch::llama;
  const int64_t fc_width = llama ? 2 * int64_t{s.mlp_width()} : 4 * C, fc_out = llama ? s.mlp_width() : 4 * C;
  ActivationPlan p;
  auto add = [&](Tensor* slot, std::vector<int64_t> shape, Format f) {
    p.entries.push_back({slot, std::move(shape), storage(f), f});
  };
  auto add_tokens = [&](Tensor* slot) { p.entries.push_back({slot, {B, T}, DType::i32, Format::fp32}); };
  const Format fp32 = Format::fp32;
  add_tokens(&a.tokens);
  add_tokens(&a.targets);
  add(&a.encoded, {B, T, C}, act);
  add(&a.ln1, {L_ln1, B, T, C}, act);
  if (!llama) add(&a.ln1_mean, {L, B, T}, fp32);
  add(&a.ln1_rstd, {L, B, T}, fp32);
  add(&a.qkv, {L, B, T, W}, act);
  if (s.qk_norm) {
    add(&a.qkv_raw, {L, B, T, W}, act);
    add(&a.qk_rstd, {L, int64_t{B} * T * (NH + s.kv_heads())}, fp32);
  }
  add(&a.atty, {L, B, T, C}, act);
  if (attention == AttentionPath::fused)  // a log-sum-exp per row (the fused backward recomputes the
    // rest), each layer's rows padded to 16 bytes: cuDNN reads 16-byte aligned tensors
    add(&a.att, {L, (int64_t{B} * NH * T + 3) / 4 * 4}, fp32);
  else
    add(&a.att, {L, B, NH, T, T}, act);
  // The projections' outputs go into the residual stream at once and no backward pass reads
  // them: one layer's room in every mode.
  add(&a.attproj, {1, B, T, C}, act);
  add(&a.residual2, {L, B, T, C}, act);
  add(&a.ln2, {L_ln2, B, T, C}, act);
  if (!llama) add(&a.ln2_mean, {L, B, T}, fp32);
  add(&a.ln2_rstd, {L, B, T}, fp32);
  add(&a.fch, {mlp_input_codes ? 1 : Lm, B, T, fc_width}, act);
  add(&a.fch_gelu, {L_hidden, B, T, fc_out}, act);
  add(&a.fcproj, {1, B, T, C}, act);
  add(&a.residual3, {s.n_layer, B, T, C}, act);  // the blocks' outputs: always kept
  add(&a.lnf, {B, T, C}, act);
  if (!llama) add(&a.lnf_mean, {B, T}, fp32);
  add(&a.lnf_rstd, {B, T}, fp32);
  add(&a.logits, {B, T, s.padded_vocab}, grad);  // overwritten in place by its gradient
  add(&a.losses, {B, T}, fp32);
  add(&a.dresidual, {B, T, C}, grad);
  add(&a.dln, {B, T, C}, grad);
  add(&a.datty, {B, T, C}, grad);
  add(&a.dfch_gelu, {B, T, fc_out}, grad);
  add(&a.dfch, {B, T, fc_width}, grad);
  add(&a.dqkv, {B, T, W}, grad);
  if (s.qk_norm) add(&a.dqkv_raw, {B, T, W}, grad);
  return p;
}
}  // namespace

int64_t model_activation_bytes(const ModelShape& s, int B, int T, size_t elem, Recompute recompute,
                               bool fp8_throughout, bool mlp_input_codes) {
  GptActivations unused;
  const DType dt = elem == 8 ? DType::f64 : DType::f32;
  return plan_activations(unused, s, B, T, Format::fp32, Format::fp32, AttentionPath::fallback,
                          [dt](Format) { return dt; }, recompute, fp8_throughout, mlp_input_codes)
      .bytes();
}

int64_t model_activation_bytes(const ModelShape& s, int B, int T, Format act, Format grad, AttentionPath attention,
                               const std::function<DType(Format)>& storage, Recompute recompute, bool fp8_throughout,
                               bool mlp_input_codes) {
  GptActivations unused;
  return plan_activations(unused, s, B, T, act, grad, attention, storage, recompute, fp8_throughout, mlp_input_codes)
      .bytes();
}

bool keeps_mlp_input_codes(const PrecisionPolicy& policy, Recompute recompute, bool fp8_throughout) {
  return fp8_throughout && policy.fp8.enabled && policy.fp8.mlp_input_codes && recompute == Recompute::none;
}

std::array<std::array<int64_t, 2>, kLinearsPerBlock> block_linear_shapes(const ModelShape& s) {
  const int64_t C = s.n_embd;
  if (s.arch == Arch::llama) {
    const int64_t H = s.mlp_width();
    return {{{C, s.qkv_width()}, {C, C}, {C, 2 * H}, {H, C}}};
  }
  return {{{C, 3 * C}, {C, C}, {C, 4 * C}, {4 * C, C}}};
}

int64_t gpt_fp8_buffer_bytes(const ModelShape& s, const PrecisionPolicy& policy, int B, int T, bool sharded_params) {
  if (!policy.fp8.enabled) return 0;
  const int64_t rows = int64_t{B} * T;
  const Fp8Linear::Weight block_weight = sharded_params && policy.fp8.primary_weights ? Fp8Linear::Weight::primary_handed
                                                                                     : Fp8Linear::Weight::cast_once;
  int64_t bytes = 0;
  for (int l = 0; l < s.n_layer; ++l)
    if (policy.fp8_block(l, s.n_layer))
      for (const auto& [C, OC] : block_linear_shapes(s)) bytes += Fp8Linear::buffer_bytes(policy.fp8, rows, C, OC, block_weight);
  if (!policy.fp8.bf16_lm_head) bytes += Fp8Linear::buffer_bytes(policy.fp8, rows, s.n_embd, s.padded_vocab);
  return bytes;
}

int64_t primary_fp8_weight_count(const ModelShape& s, const PrecisionPolicy& policy) {
  if (!policy.fp8.enabled || !policy.fp8.primary_weights) return 0;
  int64_t n = 0;
  for (const auto& [C, OC] : block_linear_shapes(s)) n += C * OC;
  return n * s.n_layer;
}

bool fp8_weights_recast(const PrecisionPolicy& policy, bool sharded_params) {
  return policy.fp8.enabled && sharded_params && !policy.fp8.primary_weights;
}

// The linear of a block whose weight tensor id is (is_block_linear).
static LinearId linear_of(ParamId id) {
  return id == kQkvw ? kQkv : id == kAttnOutw ? kAttproj : id == kMlpUpw ? kFc : kFcproj;
}

std::array<FlatRange, kLinearsPerBlock> block_linear_ranges(const ModelShape& s) {
  std::array<FlatRange, kLinearsPerBlock> out{};
  int64_t offset = 0;
  for (const ParamSpec& spec : param_specs(s)) {
    const int64_t n = shape_numel(spec.shape);
    if (is_block_linear(spec.id)) out[linear_of(spec.id)] = {offset, n};
    offset += n;
  }
  return out;
}

std::array<int64_t, kLinearsPerBlock> block_linear_elements(const ModelShape& s, int64_t begin, int64_t count) {
  std::array<int64_t, kLinearsPerBlock> out{};
  const std::array<FlatRange, kLinearsPerBlock> linears = block_linear_ranges(s);
  for (int k = 0; k < kLinearsPerBlock; ++k) out[k] = overlap(linears[k], begin, count);
  return out;
}

int fp8_input_slot(Recompute recompute, int linear, bool mlp_input_codes) {
  const bool recast = recompute == Recompute::block || linear == kAttproj ||
                      (recompute == Recompute::mlp && (linear == kFc || linear == kFcproj)) ||
                      (mlp_input_codes && linear == kFcproj);
  return recast ? linear : -1;
}

Zero3Weights zero3_weights(const ModelShape& s, bool primary_fp8, int64_t begin, int64_t count) {
  Zero3Weights z;
  const GradBucketSizes buckets = grad_bucket_sizes(s);
  z.range = count;
  z.block_weights = buckets.block;
  if (primary_fp8) {
    z.code_range = block_linear_elements(s, begin, count);
    const auto linears = block_linear_shapes(s);
    for (int k = 0; k < kLinearsPerBlock; ++k) {
      z.range -= z.code_range[k];
      z.block_weights -= linears[k][0] * linears[k][1];
      z.code_rooms[k] = GradBucketSizes::kBlockRooms * linears[k][0] * linears[k][1];
    }
  }
  z.in_block_rooms = buckets.in_block_rooms && !primary_fp8;
  z.block_room = z.in_block_rooms ? buckets.block : z.block_weights;
  GradBucketSizes heads = buckets;  // the head's and embeddings' rooms, where they are apart
  heads.in_block_rooms = z.in_block_rooms;
  z.rooms = GradBucketSizes::kBlockRooms * z.block_room + heads.rest();
  return z;
}

int64_t rope_table_bytes(const ModelShape& s, int T) {
  return s.arch == Arch::llama ? int64_t{T} * (s.head_size() / 2) * 2 * static_cast<int64_t>(sizeof(float)) : 0;
}

Transformer::Transformer(const ModelShape& shape, Backend& backend, DType dtype, int B, int T, const PrecisionPolicy& policy,
         AttentionPath attention, bool fused_gelu, Recompute recompute, MasterRange master_range, bool fp8_throughout)
    : shape_(shape),
      backend_(backend),
      dtype_(dtype),
      B_(B),
      T_(T),
      specs_(param_specs(shape)),
      attention_(attention),
      fused_gelu_(fused_gelu),
      recompute_(recompute),
      fp8_throughout_(fp8_throughout),
      formats_{policy.weights, policy.activations, policy.activation_grads} {
  PTRAIN_CHECK(T <= shape.max_seq_len, "sequence longer than the model's context");
  const int64_t n = param_count(shape);
  auto storage = [&](Format f) { return backend.storage_for(f, dtype); };
  // `count` elements in one block (at least one byte's worth: a rank's master shard may be empty).
  auto flat = [&](Format f, int64_t count) {
    const DType dt = storage(f);
    return Tensor(backend.allocate(static_cast<size_t>(std::max<int64_t>(count, 1)) * dtype_size(dt)), dt, {count},
                  backend.device())
        .with_format(f);
  };
  // Primary FP8 weights: the block linears' FP8 codes are cast from the FP32 master, so they
  // keep no copy in the weight format; every block must then be FP8.
  const int64_t primary = primary_fp8_weight_count(shape, policy);
  primary_fp8_ = primary > 0;
  primary_cast_ = PrimaryCast::due;
  // ZeRO-3 keeps only this rank's range of the GEMMs' copy, and gathers each block's (and the
  // other tensors') into a room a block before the forward or backward pass reads it; with
  // primary FP8 weights the range's block linears are kept as codes apart (allocate_code_rooms).
  sharded_params_ = master_range.sharded_params;
  PTRAIN_CHECK(!sharded_params_ || (master_range.count >= 0 && master_range.grad_buckets),
               "sharded parameters need this rank's range and grad buckets");
  codes_in_rooms_ = sharded_params_ && primary_fp8_;
  const Zero3Weights zero3 = zero3_weights(shape, codes_in_rooms_, master_range.begin, master_range.count);
  params_flat_ = flat(policy.weights, sharded_params_ ? zero3.range : n - primary);
  // The main gradients: FP32 in every mode, the backward ops adding into them directly; with
  // grad buckets one block's and the other tensors' at a time.
  num_params_ = n;
  bucket_sizes_ = grad_bucket_sizes(shape);
  grad_buckets_ = master_range.grad_buckets;
  if (grad_buckets_) {
    bucket_memory_ = flat(Format::fp32, bucket_sizes_.total());
  } else {
    grads_flat_ = flat(Format::fp32, n);
  }
  has_master_ = policy.has_master_weights();
  sharded_master_ = has_master_ && master_range.count >= 0;
  PTRAIN_CHECK(!primary_fp8_ || (has_master_ && !policy.fp8.bf16_first_last),
               "primary FP8 weights need every block in FP8 and FP32 master weights");
  if (sharded_master_) {
    PTRAIN_CHECK(master_range.begin >= 0 && master_range.begin + master_range.count <= n,
                 "the master weights' range lies outside the parameters");
    master_begin_ = master_range.begin;
    master_flat_ = flat(Format::fp32, master_range.count);
  } else if (has_master_) {
    master_flat_ = flat(Format::fp32, n);
  }
  if (master_range.count >= 0) master_begin_ = master_range.begin;
  // Weight rooms (ZeRO-3): laid out as the grad buckets are, a bucket's weights where its
  // gradients go; a block's room leaves out the linears kept as codes, and the head's and the
  // embeddings' weights then take a room of their own (zero3_weights).
  block_room_weights_ = zero3.block_weights;
  room_block_ = zero3.block_room;
  weights_in_block_rooms_ = zero3.in_block_rooms;
  linear_ranges_ = block_linear_ranges(shape);
  if (sharded_params_) weight_rooms_ = flat(policy.weights, zero3.rooms);
  // Grad buckets: the head's and the embeddings' tensors where grad_bucket_at puts them (their
  // weights where weight_room_at does).
  int64_t offset = 0, copy_offset = 0, block_offset = 0, room_offset = 0;
  std::array<int64_t, 2> embedding_at = {grad_bucket_at(-1), weight_room_at(-1)},
                         head_at = {grad_bucket_at(shape.n_layer), weight_room_at(shape.n_layer)};
  for (const ParamSpec& spec : specs_) {
    const int64_t count = shape_numel(spec.shape);
    offsets_[spec.id] = offset;
    if (is_block_param(spec.id) && !(codes_in_rooms_ && is_primary_fp8(spec.id))) {
      room_offsets_[spec.id] = room_offset;
      room_offset += count / shape.n_layer;
    }
    if (!grad_buckets_) {
      grads_[spec.id] = grads_flat_.range(offset, count).reshaped(spec.shape);
    } else if (is_block_param(spec.id)) {  // grad(id) stays empty: block_grad finds the slice
      bucket_offsets_[spec.id] = block_offset;
      block_offset += count / shape.n_layer;
    } else {
      std::array<int64_t, 2>& at = is_head_param(spec.id) ? head_at : embedding_at;
      grads_[spec.id] = bucket_memory_.range(at[0], count).reshaped(spec.shape);
      if (sharded_params_) params_[spec.id] = weight_rooms_.range(at[1], count).reshaped(spec.shape);
      at[0] += count;
      at[1] += count;
    }
    present_[spec.id] = true;
    if (sharded_params_) {  // a block tensor's layers are in the rooms in turn: block_param
      if (is_block_param(spec.id))
        params_[spec.id] =
            Tensor(nullptr, params_flat_.dtype, spec.shape, backend.device()).with_format(policy.weights);
    } else if (is_primary_fp8(spec.id)) {
      // The master the codes are cast from; a sharded master has no whole tensor (the ranks cast
      // a part each): its shape, no memory.
      params_[spec.id] = !sharded_master_ ? master_flat_.range(offset, count).reshaped(spec.shape)
                                          : Tensor(nullptr, DType::f32, spec.shape, backend.device());
    } else {
      params_[spec.id] = params_flat_.range(copy_offset, count).reshaped(spec.shape);
      copy_offset += count;
    }
    offset += count;
  }
  if (shape.arch == Arch::llama) {
    PTRAIN_CHECK(shape.head_size() % 2 == 0 && shape.n_head % shape.kv_heads() == 0,
                 "llama needs an even head size and n_head a multiple of n_kv_head");
    const std::vector<float> table = rope_table(T, shape.head_size(), shape.rope_theta);
    rope_table_ = Tensor(backend.allocate(table.size() * sizeof(float)), DType::f32,
                         {T, shape.head_size() / 2, 2}, backend.device());
    backend.upload(rope_table_, table.data());
  }

  PTRAIN_CHECK(!fp8_throughout || (policy.fp8.enabled && !policy.fp8.bf16_first_last),
               "FP8 throughout the run, but this policy runs blocks in bf16");
  const bool mlp_codes = keeps_mlp_input_codes(policy, recompute, fp8_throughout);
  ActivationPlan plan = plan_activations(a_, shape, B, T, policy.activations, policy.activation_grads, attention,
                                         storage, recompute, fp8_throughout, mlp_codes);
  act_bytes_ = plan.bytes();
  act_memory_ = backend.allocate(act_bytes_);
  char* cursor = static_cast<char*>(act_memory_);
  for (auto& e : plan.entries) {
    *e.slot = Tensor(cursor, e.dtype, e.shape, backend.device()).with_format(e.format);
    cursor += (e.slot->bytes() + 63) / 64 * 64;
  }

  if (mlp_codes) {  // E4M3, as DeepSeek-V3 stores it
    mlp_inputs_ = backend.make_fp8_activation_store(shape.n_layer, int64_t{B} * T, a_.fch.dim(-1), Format::e4m3);
    const char* fc = shape.arch == Arch::llama ? ".gate_up" : ".fc";
    for (int l = 0; l < shape.n_layer; ++l)
      mlp_input_stats_.push_back(Fp8TensorState{"h" + std::to_string(l) + fc + ".output", Format::e4m3,
                                                DelayedScaling(1, AmaxAlgo::max, format_max(Format::e4m3), 0), NAN,
                                                Fp8CastStats{}});
  }
  for (int l = 0; l < shape.n_layer; ++l) block_names_.push_back("block " + std::to_string(l));

  make_fp8_linears(policy);
  if (codes_in_rooms_) allocate_code_rooms(zero3);
}

void Transformer::allocate_code_rooms(const Zero3Weights& zero3) {
  for (int k = 0; k < kLinearsPerBlock; ++k) {
    // The layers of a linear run alike (native GEMMs, or the emulation) and read the same codes.
    const DType dtype = fp8_linear(0, static_cast<LinearId>(k))->weight_code_dtype();
    for (int l = 1; l < shape_.n_layer; ++l)
      PTRAIN_CHECK(fp8_linear(l, static_cast<LinearId>(k))->weight_code_dtype() == dtype,
                   "primary FP8 weights under ZeRO-3: the layers of one linear must all run native FP8 GEMMs or all "
                   "emulate them");
    const auto make = [&](int64_t count) {
      return Tensor(backend_.allocate(static_cast<size_t>(std::max<int64_t>(count, 1)) * dtype_size(dtype)), dtype,
                    {count}, backend_.device());
    };
    code_ranges_[k] = make(zero3.code_range[k]);
    code_rooms_[k] = make(zero3.code_rooms[k]);
  }
}

void Transformer::make_fp8_linears(const PrecisionPolicy& policy) {
  // FP8 for the four linears of each block (unless kept in bf16), and the LM head if asked.
  fp8_.clear();
  if (!policy.fp8.enabled) return;
  const int64_t rows = int64_t{B_} * T_;
  const auto linear_shapes = block_linear_shapes(shape_);
  const std::array<const char*, kLinearsPerBlock> linear_names =
      shape_.arch == Arch::llama ? std::array<const char*, kLinearsPerBlock>{"qkv", "o_proj", "gate_up", "down"}
                                 : std::array<const char*, kLinearsPerBlock>{"qkv", "attproj", "fc", "fcproj"};
  // Layers share input codes by slot (fp8_input_slot) and, under ZeRO-3, weight codes by shape
  // (fp8_weights_recast), or are handed them from code rooms (primary FP8 weights under ZeRO-3).
  // An FP8 LM head keeps its own weight codes, cast once a step, under
  // every stage.
  using Weight = Fp8Linear::Weight;
  const Weight weight = fp8_weights_recast(policy, sharded_params_) ? Weight::recast
                        : !primary_fp8_                             ? Weight::cast_once
                        : codes_in_rooms_                           ? Weight::primary_handed
                                                                    : Weight::primary;
  for (int l = 0; l < shape_.n_layer; ++l)
    for (int k = 0; k < kLinearsPerBlock; ++k)
      fp8_.push_back(policy.fp8_block(l, shape_.n_layer)
                         ? std::make_unique<Fp8Linear>("h" + std::to_string(l) + "." + linear_names[k], policy.fp8,
                                                       backend_, rows, linear_shapes[k][0], linear_shapes[k][1],
                                                       fp8_input_slot(recompute_, k, mlp_inputs_ != nullptr),
                                                       weight)
                         : nullptr);
  fp8_.push_back(policy.fp8.bf16_lm_head ? nullptr
                                         : std::make_unique<Fp8Linear>("lm_head", policy.fp8, backend_, rows,
                                                                       shape_.n_embd, shape_.padded_vocab));
}

std::string Transformer::switch_fp8(const PrecisionPolicy& policy) {
  PTRAIN_CHECK((std::array<Format, 3>{policy.weights, policy.activations, policy.activation_grads}) == formats_,
               "a precision switch keeps the formats of weights, activations and gradients");
  PTRAIN_CHECK(!primary_fp8_, "a precision switch needs the weights' copies, which primary FP8 weights do not keep");
  PTRAIN_CHECK(!fp8_throughout_ || (policy.fp8.enabled && !policy.fp8.bf16_first_last),
               "the model keeps its linears' inputs as FP8 codes only: a switch cannot run a block in bf16");
  // The recordings replay the old layers' casts, and cached keys came from the old GEMMs.
  recordings_.clear();
  decoded_ = 0;
  make_fp8_linears(policy);
  // The new layers may be recordable where the old were not, or the reverse.
  return recording_asked_ && recording_failure_.empty() ? record_micro_batches() : std::string();
}

Transformer::~Transformer() {
  if (!rope_table_.empty()) backend_.release(rope_table_.data);
  backend_.release(act_memory_);
  backend_.release(grads_flat_.empty() ? bucket_memory_.data : grads_flat_.data);
  if (!weight_rooms_.empty()) backend_.release(weight_rooms_.data);
  for (const Tensor& t : code_ranges_)
    if (!t.empty()) backend_.release(t.data);
  for (const Tensor& t : code_rooms_)
    if (!t.empty()) backend_.release(t.data);
  backend_.release(params_flat_.data);
  if (!master_flat_.empty()) backend_.release(master_flat_.data);
}

Tensor Transformer::master(ParamId id) const {
  if (sharded_master_ || master_flat_.empty()) return params_[id];
  const Tensor& p = params_[id];
  return master_flat_.range(offsets_[id], p.numel())
      .reshaped(std::vector<int64_t>(p.shape.begin(), p.shape.begin() + p.ndim));
}

void Transformer::load_weights(ParamId id, const float* host, int64_t begin, int64_t count) {
  const int64_t n = count < 0 ? params_[id].numel() - begin : count, at = offsets_[id] + begin;
  PTRAIN_CHECK(begin >= 0 && begin + n <= params_[id].numel(), "load_weights: the elements lie outside the tensor");
  if (!sharded_master_ && !sharded_params_) {
    backend_.upload(master(id).range(begin, n), host);
    return;
  }
  // This rank's range of the FP32 values, straight into its master shard.
  const int64_t shard = sharded_master_ ? master_flat_.numel() : params_flat_.numel();  // fp32 ZeRO-3: the values
  const int64_t lo = std::max(at, master_begin_), hi = std::min(at + n, master_begin_ + shard);
  if (sharded_master_ && lo < hi) backend_.upload(master_flat_.range(lo - master_begin_, hi - lo), host + (lo - at));
  // The GEMMs' copy, rounded from FP32 values staged a piece at a time (primary FP8 weights
  // keep none: the ranks cast their codes a part each before the next forward pass);
  // under ZeRO-3 this rank's range of it only (in fp32 the copy is the values themselves).
  if (is_primary_fp8(id)) return;
  const Tensor staging = grad_buckets_ ? bucket_memory_ : grads_flat_;
  const auto stage = [&](Tensor dst, const float* src) {
    for (int64_t done = 0; done < dst.numel(); done += staging.numel()) {
      const int64_t len = std::min(staging.numel(), dst.numel() - done);
      backend_.upload(staging.range(0, len), src + done);
      backend_.copy(dst.range(done, len), staging.range(0, len));
    }
  };
  if (!sharded_params_)
    stage(params_[id].range(begin, n), host);
  else if (lo < hi && has_master_)
    stage(range_copy({lo, hi - lo}), host + (lo - at));
  else if (lo < hi)
    backend_.upload(range_copy({lo, hi - lo}), host + (lo - at));
}

void Transformer::weights_loaded() {
  decoded_ = 0;  // the cached keys and values came from the old weights
  if (primary_fp8_) primary_cast_ = PrimaryCast::due;
  if (sharded_master_ || sharded_params_) {  // load_weights wrote the copies; the staging buffer is clean again
    backend_.zero(grad_buckets_ ? bucket_memory_ : grads_flat_);
  } else if (primary_fp8_) {  // the other tensors' copies
    for (const ParamSpec& spec : specs_)
      if (!is_primary_fp8(spec.id))
        backend_.copy(params_[spec.id], master_flat_.range(offsets_[spec.id], shape_numel(spec.shape)));
  } else if (has_master_) {
    backend_.copy(params_flat_, master_flat_);
  }
}

// Which bucket (grads_done's argument) tensor id's gradients belong to: the head's is L, the
// embeddings' -1; a block tensor's is its layer's.
static bool in_bucket(ParamId id, int bucket, int n_layer) {
  if (bucket == n_layer) return is_head_param(id);
  if (bucket < 0) return !is_block_param(id) && !is_head_param(id);
  return is_block_param(id);
}

void Transformer::cast_primary_fp8_weights(Tensor full_master, bool training) {
  PTRAIN_CHECK(primary_fp8_ && full_master.numel() == num_params(),
               "cast_primary_fp8_weights: primary FP8 weights, cast from the whole FP32 master in the flat layout");
  for (const ParamSpec& spec : specs_) {
    if (!is_primary_fp8(spec.id)) continue;
    const Tensor master = full_master.range(offsets_[spec.id], shape_numel(spec.shape)).reshaped(spec.shape);
    for (int l = 0; l < shape_.n_layer; ++l) fp8_linear(l, linear_of(spec.id))->cast_weight(master[l], training);
  }
  finish_primary_fp8_cast(training);
}

std::vector<Transformer::PrimaryFp8Layer> Transformer::primary_fp8_layers() const {
  std::vector<PrimaryFp8Layer> layers;
  for (const ParamSpec& spec : specs_) {
    if (!is_primary_fp8(spec.id)) continue;
    const int64_t per_layer = shape_numel(spec.shape) / shape_.n_layer;
    for (int l = 0; l < shape_.n_layer; ++l)
      layers.push_back({fp8_linear(l, linear_of(spec.id)), FlatRange{offsets_[spec.id] + l * per_layer, per_layer}});
  }
  return layers;
}

void Transformer::finish_primary_fp8_cast(bool training) {
  primary_cast_ = training ? PrimaryCast::done : PrimaryCast::evaluated;
}

void Transformer::cast_due_primary_weights(bool training) {
  if (!primary_fp8_cast_due(training)) return;
  PTRAIN_CHECK(!sharded_master_, "a sharded master's primary FP8 weights are cast a part per rank "
                                 "(AdamW::gather_primary_fp8_weights) before a forward pass");
  cast_primary_fp8_weights(master_flat_, training);
}

Fp8Linear* Transformer::lm_head_fp8() const { return fp8_.empty() ? nullptr : fp8_.back().get(); }

Fp8Linear* Transformer::fp8_linear(int layer, LinearId which) const {
  if (fp8_.empty()) return nullptr;
  return fp8_[static_cast<size_t>(layer) * kLinearsPerBlock + which].get();
}

void Transformer::linear_forward(Fp8Linear* fp8, Tensor out, Tensor inp, Tensor weight, Tensor bias, bool training) {
  if (fp8)
    fp8->forward(out, inp, weight, bias, training);
  else
    backend_.matmul_forward(out, inp, weight, bias);
}

void Transformer::linear_backward(Fp8Linear* fp8, Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp,
                          Tensor weight) {
  if (fp8)
    fp8->backward(dinp, dweight, dbias, dout, weight);
  else
    backend_.matmul_backward(dinp, dweight, dbias, dout, inp, weight);
}

void Transformer::queue_fp8_settle() {
  for (auto& f : fp8_)
    if (f) f->queue_settle();
}

void Transformer::abandon_step() {
  queue_fp8_settle();
  for (auto& f : fp8_)
    if (f) f->abandon_step();
  // The codes stand (the weights did not change), the step's training cast is forgotten.
  if (primary_cast_ == PrimaryCast::done) primary_cast_ = PrimaryCast::evaluated;
}

void Transformer::end_step() {
  queue_fp8_settle();
  for (auto& f : fp8_)
    if (f) f->end_step();
  primary_cast_ = PrimaryCast::due;
}

std::vector<Fp8TensorState*> Transformer::fp8_tensors() {
  queue_fp8_settle();
  std::vector<Fp8TensorState*> all;
  for (auto& f : fp8_)
    if (f)
      for (Fp8TensorState* t : f->tensors()) all.push_back(t);
  return all;
}

std::vector<Fp8TensorState*> Transformer::numerics_tensors() {
  std::vector<Fp8TensorState*> all = fp8_tensors();
  if (!mlp_inputs_) return all;
  const std::vector<Fp8CastStats> taken = mlp_inputs_->take_stats();
  for (size_t l = 0; l < mlp_input_stats_.size(); ++l) {
    mlp_input_stats_[l].stats.merge(taken[l]);
    all.push_back(&mlp_input_stats_[l]);
  }
  return all;
}

Tensor Transformer::saved_attention(int layer) const {
  const Tensor saved = a_.att[block_slot(layer)];
  if (attention_ == AttentionPath::fallback) return saved;
  const int64_t rows = int64_t{B_} * shape_.n_head * T_;
  return saved.range(0, rows).reshaped({B_, shape_.n_head, T_});
}

std::string Transformer::fp8_gemm_summary() const {
  int total = 0, native = 0;
  std::string why;
  for (const auto& f : fp8_) {
    if (!f) continue;
    ++total;
    if (f->native()) ++native;
    else if (why.empty()) why = f->native_fp8_absent();
  }
  if (total == 0) return "";
  std::string line = std::to_string(native) + " of " + std::to_string(total) + " FP8 linear layers run native FP8 GEMMs";
  if (native < total) line += "; the others emulate (" + why + ")";
  if (primary_fp8_) line += "; the block linears' weights are FP8 codes only, cast from the FP32 master (primary)";
  if (mlp_inputs_) line += "; the MLP's input is kept for the backward pass as E4M3 codes in 1x128 tiles";
  return line;
}

int64_t Transformer::native_fp8_weights() const {
  int64_t n = 0;
  for (const auto& f : fp8_)
    if (f && f->native()) n += f->weights();
  return n;
}

void Transformer::init(uint64_t seed, double std) {
  const double residual_std = std / std::sqrt(2.0 * shape_.n_layer);
  // A piece at a time (a 70B model's stacked MLP weights are 150 GB of floats), each tensor's
  // draws in one sequence.
  constexpr int64_t kPiece = int64_t{1} << 24;
  std::vector<float> host;
  for (const ParamSpec& spec : specs_) {
    const int i = spec.id;
    const int64_t n = shape_numel(spec.shape);
    const bool is_norm_weight = (i == kNorm1w || i == kNorm2w || i == kNormFw || i == kQNormw || i == kKNormw);
    const double tensor_std = (i == kAttnOutw || i == kMlpDownw) ? residual_std : std;
    // Padded vocabulary rows stay zero: they never win a softmax and get no gradient.
    const int64_t drawn = !spec.weight_decay                 ? 0
                          : (i == kWte || i == kLmHead) ? int64_t{shape_.vocab} * shape_.n_embd
                                                        : n;
    Rng rng(seed, static_cast<uint64_t>(i));
    for (int64_t begin = 0; begin < n; begin += kPiece) {
      host.assign(static_cast<size_t>(std::min(kPiece, n - begin)), is_norm_weight ? 1.0f : 0.0f);
      for (int64_t j = begin; j < std::min(drawn, begin + kPiece); ++j)  // the 2-D weights
        host[static_cast<size_t>(j - begin)] = static_cast<float>(rng.normal() * tensor_std);
      load_weights(spec.id, host.data(), begin, static_cast<int64_t>(host.size()));
    }
  }
  // The master weights hold the values; the GEMMs' copy is them rounded to its format.
  weights_loaded();
}

Tensor Transformer::residual_in(int layer) const {
  return layer == 0 ? a_.encoded : a_.residual3[layer - 1];
}

double Transformer::forward(const int32_t* inputs, const int32_t* targets, float dloss) {
  load_batch(inputs, targets);
  cast_due_primary_weights(dloss != 0);
  forward_loss(dloss);
  return backend_.sum(a_.losses) / static_cast<double>(a_.losses.numel());
}

// Checked on the host: a replayed micro-batch runs no host-side check of its own, and an id past
// the vocabulary would make the embedding read and write outside its table.
void Transformer::check_tokens(const int32_t* ids, int64_t n, const char* what) const {
  for (int64_t i = 0; i < n; ++i)
    if (ids[i] < 0 || ids[i] >= shape_.vocab)
      throw UserError(std::string(what) + " token id " + std::to_string(ids[i]) + " at position " + std::to_string(i) +
                      " of the micro-batch is outside the vocabulary [0, " + std::to_string(shape_.vocab) + ")");
}

void Transformer::load_batch(const int32_t* inputs, const int32_t* targets) {
  decoded_ = 0;  // a replayed micro-batch overwrites the activations without forward_pass
  const int64_t n = int64_t{B_} * T_;
  check_tokens(inputs, n, "input");
  check_tokens(targets, n, "target");
  backend_.upload_tokens(a_.tokens, inputs);
  backend_.upload_tokens(a_.targets, targets);
}

void Transformer::forward_loss(float dloss) {
  const bool training = dloss != 0;
  forward_logits(training);
  backend_.classifier(a_.logits, a_.losses, a_.targets, shape_.vocab, dloss);
  grads_ready_ = training;
}

void Transformer::train_micro_batch(const int32_t* inputs, const int32_t* targets, float dloss, Tensor loss_sum,
                            const std::function<void(int block)>& grads_done) {
  PTRAIN_CHECK(dloss != 0, "train_micro_batch needs a loss gradient (dloss != 0)");
  load_batch(inputs, targets);
  cast_due_primary_weights(true);  // as called, never in a recording
  if (recording_on_ && !grads_done) {
    run_recorded(dloss);
  } else {
    forward_and_backward(dloss, grads_done);
  }
  backend_.sum_into(loss_sum, a_.losses);
}

void Transformer::forward_and_backward(float dloss, const std::function<void(int block)>& grads_done) {
  {
    NvtxRange range("forward");
    forward_loss(dloss);
  }
  NvtxRange range("backward");
  backward(grads_done);
}

std::string Transformer::record_micro_batches() {
  recording_asked_ = true;
  std::string why = backend_.cannot_record();
  if (why.empty() && grad_buckets_)
    why = "distributed.zero_stage " + std::string(sharded_params_ ? "3" : "2") +
          " hands each gradient bucket to the communicator as the backward pass finishes it, in every micro-batch";
  for (const auto& f : fp8_)
    if (why.empty() && f) why = f->unrecordable();
  recording_on_ = why.empty();
  return why;
}

Transformer::HostProgress Transformer::host_progress(float dloss) const {
  HostProgress p;
  std::memcpy(&p.dloss_bits, &dloss, sizeof dloss);
  p.grads_ready = grads_ready_;
  for (const auto& f : fp8_) p.fp8.push_back(f ? f->host_state() : Fp8Linear::HostState{});
  return p;
}

void Transformer::restore(const HostProgress& progress) {
  grads_ready_ = progress.grads_ready;
  for (size_t i = 0; i < fp8_.size(); ++i)
    if (fp8_[i]) fp8_[i]->restore(progress.fp8[i]);
}

void Transformer::run_recorded(float dloss) {
  const auto run = [&] { forward_and_backward(dloss, {}); };
  const HostProgress before = host_progress(dloss);
  // Loss scaling moved to a new dloss: the recordings made with the old one are done with.
  recordings_.erase(std::remove_if(recordings_.begin(), recordings_.end(),
                                   [&](const Recording& r) { return r.before.dloss_bits != before.dloss_bits; }),
                    recordings_.end());
  auto it = std::find_if(recordings_.begin(), recordings_.end(), [&](const Recording& r) { return r.before == before; });
  if (it == recordings_.end() || it->memory_epoch != backend_.memory_epoch()) {
    // The first of its kind, or memory was handed out anew since its recording (which may point
    // at it): run as called, which also lets the backend settle its caches and scratch memory.
    if (it == recordings_.end()) it = recordings_.insert(recordings_.end(), Recording{before, {}, 0, nullptr});
    it->work.reset();
    run();
    it->memory_epoch = backend_.memory_epoch();
    return;
  }
  if (!it->work) {
    std::string why;
    const uint64_t epoch = backend_.memory_epoch();
    it->work = backend_.record(run, &why);
    if (!it->work) {  // nothing of it ran on the device: run it as called, and from now on
      recording_on_ = false;
      recording_failure_ = why;
      recordings_.clear();
      restore(before);
      run();
      return;
    }
    it->after = host_progress(dloss);
    it->memory_epoch = backend_.memory_epoch();
    if (it->memory_epoch != epoch) {
      // Memory was handed out during the recording, whose replays would repeat that (zeroing
      // it each time): this replay does the micro-batch's work, the next one records afresh.
      replay(*it);
      it->work.reset();
      return;
    }
  }
  replay(*it);
}

void Transformer::replay(Recording& recording) {
  NvtxRange range("forward and backward (CUDA graph replay)");
  recording.work->replay();
  restore(recording.after);
  ++replays_;
}

std::vector<float> Transformer::logits_at(int position) const {
  std::vector<float> row(static_cast<size_t>(shape_.padded_vocab));
  backend_.download(row.data(), a_.logits[0][position]);
  row.resize(static_cast<size_t>(shape_.vocab));
  return row;
}

std::vector<float> Transformer::start_decoding(const int32_t* tokens, int length) {
  PTRAIN_CHECK(length >= 1 && length <= T_, "decoding starts from 1 to seq_len tokens");
  PTRAIN_CHECK(fp8_.empty(), "decoding runs without FP8 linears");
  PTRAIN_CHECK(recompute_ != Recompute::block, "decoding needs every layer's keys and values (not Recompute::block)");
  check_tokens(tokens, length, "prompt");
  // Every sequence of the micro-batch runs; only sequence 0's first `length` positions count.
  std::vector<int32_t> window(static_cast<size_t>(B_) * T_, 0);
  std::copy(tokens, tokens + length, window.begin());
  backend_.upload_tokens(a_.tokens, window.data());
  forward_logits(/*training=*/false);
  decoded_ = length;
  return logits_at(length - 1);
}

std::vector<float> Transformer::window_logits(const int32_t* tokens) {
  start_decoding(tokens, T_);
  std::vector<float> out;
  for (int t = 0; t < T_; ++t) {
    const std::vector<float> row = logits_at(t);
    out.insert(out.end(), row.begin(), row.end());
  }
  return out;
}

std::vector<float> Transformer::decode_next(int32_t token) {
  PTRAIN_CHECK(decoded_ > 0, "decode_next needs start_decoding first");
  PTRAIN_CHECK(decoded_ < T_, "decoding is at the model's context length");
  check_tokens(&token, 1, "decoded");
  const int position = decoded_;
  backend_.upload_tokens(a_.tokens[0].range(position, 1).reshaped({1, 1}), &token);
  forward_pass(position, /*training=*/false);
  decoded_ = position + 1;
  return logits_at(position);
}

Tensor Transformer::rows_at(Tensor t, int position) const {
  if (position < 0) return t;
  const Tensor sequence = t[0];
  const int64_t width = sequence.numel() / T_;
  return sequence.range(position * width, width).reshaped({1, 1, width});
}

void Transformer::attention_forward(int layer, int position) {
  if (position < 0) {
    const int b = block_slot(layer);
    return backend_.attention_forward(a_.atty[b], saved_attention(layer), a_.qkv[b], shape_.n_head);
  }
  const int64_t W = shape_.qkv_width();
  const Tensor cached = a_.qkv[layer][0].range(0, (position + 1) * W).reshaped({position + 1, W});
  backend_.attention_decode(rows_at(a_.atty[layer], position), cached, shape_.n_head);
}

Tensor Transformer::rope_rows(int position) const {
  if (position < 0) return rope_table_;
  const int64_t row = rope_table_.numel() / T_;
  return rope_table_.range(position * row, row).reshaped({1, rope_table_.dim(1), 2});
}

Tensor Transformer::lm_head() const { return shape_.tied_head ? params_[kWte] : params_[kLmHead]; }

void Transformer::forward_pass(int position, bool training) {
  const int L = shape_.n_layer;
  const int64_t C = shape_.n_embd;
  Backend& be = backend_;
  decoded_ = 0;
  const auto at = [&](Tensor t) { return rows_at(t, position); };
  // GPT-2 adds learned positions here; Llama's positions are RoPE's, inside attention.
  Tensor wpe;
  if (shape_.arch == Arch::gpt2) wpe = position < 0 ? params_[kWpe] : params_[kWpe][position].reshaped({1, C});

  PTRAIN_CHECK(position < 0 || !sharded_params_, "decoding needs the whole weights, which ZeRO-3 does not keep");
  // ZeRO-3: each gather starts a block ahead of its use, so it runs beside the block before it
  // (whose room it does not touch); a wait comes before each new start. The embeddings (-1)
  // and the head (L) take their rooms' turns before block 0 and after block L-1, as their
  // gradients do; the head's stays through the backward pass's first step.
  start_weights(-1);
  start_weights(0);
  await_weights();
  be.embedding_forward(at(a_.encoded), at(a_.tokens), params_[kWte], wpe);
  for (int l = 0; l < L; ++l) {
    NvtxRange range(block_names_[l].c_str());
    await_weights();
    start_weights(l + 1);
    block_forward(l, position, training);
  }
  await_weights();
  const Tensor lnf = at(a_.lnf);
  if (shape_.arch == Arch::llama)
    be.rmsnorm_forward(lnf, at(a_.lnf_rstd), at(residual_in(L)), params_[kNormFw], shape_.norm_eps);
  else
    be.layernorm_forward(lnf, at(a_.lnf_mean), at(a_.lnf_rstd), at(residual_in(L)), params_[kNormFw], params_[kNormFb]);
  linear_forward(lm_head_fp8(), at(a_.logits), lnf, lm_head(), Tensor(), training);
}

// x -> LayerNorm -> qkv (with biases) -> attention -> attproj -> + x -> LayerNorm -> fc ->
// GELU -> fcproj -> + residual2.
void Transformer::block_forward(int l, int position, bool training) {
  if (shape_.arch == Arch::llama)
    llama_block_forward(l, position, training);
  else
    gpt2_block_forward(l, position, training);
}

void Transformer::mlp_hidden_forward(int l, int position, bool training) {
  const auto at = [&](Tensor t) { return rows_at(t, position); };
  const Tensor ln2 = at(a_.ln2[ln2_slot(l)]), fch = at(a_.fch[fch_slot(l)]);
  Fp8Linear* fc = fp8_linear(l, kFc);
  if (shape_.arch != Arch::llama && !fc && fused_gelu_) {
    backend_.matmul_gelu_forward(at(a_.fch_gelu[hidden_slot(l)]), fch, ln2, block_param(kMlpUpw, l),
                                 block_param(kMlpUpb, l));
    return;
  }
  linear_forward(fc, fch, ln2, block_param(kMlpUpw, l), shape_.arch == Arch::llama ? Tensor() : block_param(kMlpUpb, l),
                 training);
  if (mlp_inputs_) {
    // The activation reads the stored values, forward as backward (mlp_hidden_from_codes).
    PTRAIN_CHECK(position < 0, "decoding with the MLP's pre-activation stored as FP8 codes");
    mlp_inputs_->store(l, fch, training);
    mlp_inputs_->load(l, fch);
  }
  mlp_activation(at(a_.fch_gelu[hidden_slot(l)]), fch);
}

void Transformer::mlp_activation(Tensor hidden, Tensor fch) {
  if (shape_.arch == Arch::llama)
    backend_.swiglu_forward(hidden, fch);
  else
    backend_.gelu_forward(hidden, fch);
}

void Transformer::mlp_hidden_from_codes(int l) {
  mlp_inputs_->load(l, a_.fch[fch_slot(l)]);
  // The activation's backward pass reads the values; a down projection that emulates FP8 kept
  // its own input codes, one whose codes are shared needs them again.
  Fp8Linear* down = fp8_linear(l, kFcproj);
  if (!down->shares_input_codes()) return;
  mlp_activation(a_.fch_gelu[hidden_slot(l)], a_.fch[fch_slot(l)]);
  down->recast_input(a_.fch_gelu[hidden_slot(l)]);
}

void Transformer::recompute_mlp(int l) {
  mlp_hidden_forward(l, -1, /*training=*/true);  // the up projection casts its input again
  // The down projection's input codes sit in the MLP's shared slot too: cast them again.
  if (Fp8Linear* down = fp8_linear(l, kFcproj)) down->recast_input(a_.fch_gelu[hidden_slot(l)]);
}

void Transformer::gpt2_block_forward(int l, int position, bool training) {
  Backend& be = backend_;
  const auto at = [&](Tensor t) { return rows_at(t, position); };
  const int b = block_slot(l);
  const Tensor x = at(residual_in(l)), ln1 = at(a_.ln1[ln1_slot(l)]), qkv = at(a_.qkv[b]), atty = at(a_.atty[b]);
  const Tensor attproj = at(a_.attproj[0]), residual2 = at(a_.residual2[b]), ln2 = at(a_.ln2[ln2_slot(l)]);
  const Tensor fch_gelu = at(a_.fch_gelu[hidden_slot(l)]), fcproj = at(a_.fcproj[0]);
  be.layernorm_forward(ln1, at(a_.ln1_mean[b]), at(a_.ln1_rstd[b]), x, block_param(kNorm1w, l), block_param(kNorm1b, l));
  linear_forward(fp8_linear(l, kQkv), qkv, ln1, block_param(kQkvw, l), block_param(kQkvb, l), training);
  attention_forward(l, position);
  linear_forward(fp8_linear(l, kAttproj), attproj, atty, block_param(kAttnOutw, l), block_param(kAttnOutb, l), training);
  be.add(residual2, x, attproj);
  be.layernorm_forward(ln2, at(a_.ln2_mean[b]), at(a_.ln2_rstd[b]), residual2, block_param(kNorm2w, l), block_param(kNorm2b, l));
  mlp_hidden_forward(l, position, training);
  linear_forward(fp8_linear(l, kFcproj), fcproj, fch_gelu, block_param(kMlpDownw, l), block_param(kMlpDownb, l), training);
  be.add(at(a_.residual3[l]), residual2, fcproj);
}

// x -> RMSNorm -> qkv (no biases) [-> QK-norm] -> RoPE on q's and k's heads -> attention ->
// o_proj -> + x -> RMSNorm -> gate_up -> SwiGLU -> down -> + residual2. RoPE turns qkv in place:
// what attention and its backward read is the turned q and k. With QK-norm the projection's
// output is kept apart (qkv_raw) for QK-norm's backward pass.
void Transformer::llama_block_forward(int l, int position, bool training) {
  Backend& be = backend_;
  const auto at = [&](Tensor t) { return rows_at(t, position); };
  const float eps = shape_.norm_eps;
  const int b = block_slot(l);
  const Tensor x = at(residual_in(l)), ln1 = at(a_.ln1[ln1_slot(l)]), qkv = at(a_.qkv[b]), atty = at(a_.atty[b]);
  const Tensor attproj = at(a_.attproj[0]), residual2 = at(a_.residual2[b]), ln2 = at(a_.ln2[ln2_slot(l)]);
  const Tensor swiglu = at(a_.fch_gelu[hidden_slot(l)]), down = at(a_.fcproj[0]);
  be.rmsnorm_forward(ln1, at(a_.ln1_rstd[b]), x, block_param(kNorm1w, l), eps);
  if (shape_.qk_norm) {
    // A decoded row's statistics go in the first slots: decoding never runs a backward pass.
    const Tensor raw = at(a_.qkv_raw[b]);
    const Tensor rstd = position < 0 ? a_.qk_rstd[b] : a_.qk_rstd[b].range(0, shape_.n_head + shape_.kv_heads());
    linear_forward(fp8_linear(l, kQkv), raw, ln1, block_param(kQkvw, l), Tensor(), training);
    be.qk_norm_forward(qkv, rstd, raw, block_param(kQNormw, l), block_param(kKNormw, l), shape_.n_head, eps);
  } else {
    linear_forward(fp8_linear(l, kQkv), qkv, ln1, block_param(kQkvw, l), Tensor(), training);
  }
  be.rope_forward(qkv, rope_rows(position), shape_.n_head + shape_.kv_heads());
  attention_forward(l, position);
  linear_forward(fp8_linear(l, kAttproj), attproj, atty, block_param(kAttnOutw, l), Tensor(), training);
  be.add(residual2, x, attproj);
  be.rmsnorm_forward(ln2, at(a_.ln2_rstd[b]), residual2, block_param(kNorm2w, l), eps);
  mlp_hidden_forward(l, position, training);
  linear_forward(fp8_linear(l, kFcproj), down, swiglu, block_param(kMlpDownw, l), Tensor(), training);
  be.add(at(a_.residual3[l]), residual2, down);
}

std::vector<Tensor> Transformer::block_grads(int block) const {
  std::vector<Tensor> out;
  for (const ParamSpec& spec : specs_) {
    const Tensor g = grad(spec.id);
    if (!in_bucket(spec.id, block, shape_.n_layer)) continue;
    out.push_back(is_block_param(spec.id) ? g[block] : g);
  }
  return out;
}

Tensor Transformer::block_grad(ParamId id, int layer) const {
  if (!grad_buckets_) return grads_[id].empty() ? Tensor() : grads_[id][layer];
  return present_[id] ? layer_of(grad_bucket(layer), id, bucket_offsets_) : Tensor();
}

Tensor Transformer::block_param(ParamId id, int layer) const {
  if (!sharded_params_) return params_[id].empty() ? Tensor() : params_[id][layer];
  if (!present_[id]) return Tensor();
  if (codes_in_rooms_ && is_primary_fp8(id)) return code_room(layer, linear_of(id));  // what its Fp8Linear is handed
  return layer_of(weight_room(layer), id, room_offsets_);
}

Tensor Transformer::weight_room(int bucket) const {
  PTRAIN_CHECK(sharded_params_, "weight_room: this model keeps the whole weights");
  const bool block = bucket >= 0 && bucket < shape_.n_layer;
  return weight_rooms_.range(weight_room_at(bucket), block ? block_room_weights_ : bucket_numel(bucket));
}

std::vector<FlatRange> Transformer::weight_room_ranges(int bucket) const {
  return bucket_ranges(bucket, /*without_codes=*/codes_in_rooms_);
}

Tensor Transformer::code_room(int layer, int linear) const {
  const Tensor& room = code_rooms_[static_cast<size_t>(linear)];
  if (room.empty()) return Tensor();
  constexpr int rooms = GradBucketSizes::kBlockRooms;
  const int64_t per_layer = room.numel() / rooms;
  return room.range(layer % rooms * per_layer, per_layer);
}

FlatRange Transformer::primary_layer_range(int layer, int linear) const {
  PTRAIN_CHECK(codes_in_rooms_, "primary_layer_range: this model keeps no primary FP8 weights in parts");
  const FlatRange every_layer = linear_ranges_[static_cast<size_t>(linear)];
  const int64_t per_layer = every_layer.count / shape_.n_layer;
  return {every_layer.begin + layer * per_layer, per_layer};
}

int64_t Transformer::primary_before(int64_t at) const {
  if (!codes_in_rooms_) return 0;
  int64_t before = 0;
  for (const FlatRange& linear : linear_ranges_) before += overlap(linear, master_begin_, at - master_begin_);
  return before;
}

Tensor Transformer::range_copy(FlatRange f) const {
  PTRAIN_CHECK(sharded_params_ && f.begin >= master_begin_ && f.count >= 0,
               "range_copy: ZeRO-3's elements of this rank's range");
  return params_flat_.range(f.begin - master_begin_ - primary_before(f.begin), f.count);
}

Tensor Transformer::range_codes(FlatRange f) const {
  for (int k = 0; k < kLinearsPerBlock; ++k) {
    const FlatRange& every_layer = linear_ranges_[static_cast<size_t>(k)];
    if (f.begin < every_layer.begin || f.begin >= every_layer.begin + every_layer.count) continue;
    PTRAIN_CHECK(codes_in_rooms_ && f.begin >= master_begin_ && f.begin + f.count <= every_layer.begin + every_layer.count,
                 "range_codes: the elements are not this rank's codes of one primary FP8 weight");
    return code_ranges_[static_cast<size_t>(k)].range(f.begin - std::max(every_layer.begin, master_begin_), f.count);
  }
  PTRAIN_CHECK(false, "range_codes: the elements are not a primary FP8 weight's");
  return {};
}

void Transformer::start_weights(int bucket) {
  if (!sharded_params_) return;
  PTRAIN_CHECK(weight_gather_.start && weight_gather_.wait,
               "sharded parameters: no weight gather was set (set_weight_gather)");
  weight_gather_.start(bucket);
}

void Transformer::await_weights() {
  if (sharded_params_) weight_gather_.wait();
}

Tensor Transformer::layer_of(Tensor bucket, ParamId id, const std::array<int64_t, kNumParams>& offsets) const {
  const Tensor& p = params_[id];
  return bucket.range(offsets[id], p.numel() / p.shape[0])
      .reshaped(std::vector<int64_t>(p.shape.begin() + 1, p.shape.begin() + p.ndim));
}

Tensor Transformer::grad_bucket(int bucket) const {
  PTRAIN_CHECK(grad_buckets_, "grad_bucket: this model keeps whole gradients");
  return bucket_memory_.range(grad_bucket_at(bucket), bucket_numel(bucket));
}

int64_t Transformer::bucket_numel(int bucket) const {
  const GradBucketSizes& sizes = bucket_sizes_;
  return bucket == shape_.n_layer ? sizes.head : bucket < 0 ? sizes.embedding : sizes.block;
}

int64_t Transformer::bucket_at(int bucket, int64_t block_room, bool in_block_rooms) const {
  const GradBucketSizes& sizes = bucket_sizes_;
  const bool block = bucket >= 0 && bucket < shape_.n_layer;
  // The head (L) and the embeddings (-1) take the block rooms' turns after block L-1 and before
  // block 0 (GradBucketSizes::in_block_rooms).
  constexpr int rooms = GradBucketSizes::kBlockRooms;
  if (block || in_block_rooms) return (bucket % rooms + rooms) % rooms * block_room;
  const int64_t rest_at = rooms * block_room;
  return bucket < 0 || sizes.shared ? rest_at : rest_at + sizes.embedding;
}

std::vector<FlatRange> Transformer::grad_bucket_ranges(int bucket) const {
  return bucket_ranges(bucket, /*without_codes=*/false);
}

std::vector<FlatRange> Transformer::bucket_ranges(int bucket, bool without_codes) const {
  std::vector<FlatRange> out;
  for (const ParamSpec& spec : specs_) {
    if (!in_bucket(spec.id, bucket, shape_.n_layer) || (without_codes && is_primary_fp8(spec.id))) continue;
    const int64_t n = shape_numel(spec.shape);
    if (is_block_param(spec.id))
      out.push_back({offsets_[spec.id] + bucket * (n / shape_.n_layer), n / shape_.n_layer});
    else
      out.push_back({offsets_[spec.id], n});
  }
  return out;
}

void Transformer::backward(const std::function<void(int block)>& grads_done) {
  PTRAIN_CHECK(grads_ready_, "backward() needs a forward() with dloss != 0 first");
  PTRAIN_CHECK(!grad_buckets_ || grads_done, "backward(): grad buckets must be handed on as they complete");
  grads_ready_ = false;
  const int L = shape_.n_layer;
  const bool llama = shape_.arch == Arch::llama;
  Backend& be = backend_;
  auto& g = grads_;
  auto& p = params_;
  // Each bucket holds this micro-batch's gradients only: the owners' shards accumulate them. A
  // tied LM head adds into the token embedding's gradient from here on.
  if (grad_buckets_) {
    be.zero(grad_bucket(L));
    if (shape_.tied_head) be.zero(grad_bucket(-1));
  }

  // LM head and the final norm; dresidual collects the residual stream's gradient from here
  // down to the embedding.
  // ZeRO-3 gathers the last block's weights again (the ZeRO paper's count: every block twice a
  // step), beside the head's backward pass.
  start_weights(L - 1);
  be.zero(a_.dln);
  linear_backward(lm_head_fp8(), a_.dln, shape_.tied_head ? g[kWte] : g[kLmHead], Tensor(), a_.logits, a_.lnf,
                  lm_head());
  be.zero(a_.dresidual);
  if (llama)
    be.rmsnorm_backward(a_.dresidual, g[kNormFw], a_.dln, residual_in(L), p[kNormFw], a_.lnf_rstd);
  else
    be.layernorm_backward(a_.dresidual, g[kNormFw], g[kNormFb], a_.dln, residual_in(L), p[kNormFw], a_.lnf_mean, a_.lnf_rstd);
  if (grads_done) grads_done(L);

  for (int l = L - 1; l >= 0; --l) {
    NvtxRange range(block_names_[l].c_str());
    // ZeRO-3: this block's gather has landed; the next one's runs beside this block (and behind
    // the sum of the bucket just handed on, on the same NCCL stream).
    await_weights();
    if (l > 0) start_weights(l - 1);
    // What the forward pass did not keep, made again from what it kept (the same bits). The
    // last block's activations are still there from the forward pass.
    const bool still_there = l == L - 1;
    if (!still_there && recompute_ == Recompute::block) {
      NvtxRange again("recompute block");
      block_forward(l, -1, /*training=*/true);
    } else if (!still_there) {
      if (recompute_ == Recompute::mlp) {
        NvtxRange again("recompute mlp");
        recompute_mlp(l);
      } else if (mlp_inputs_) {
        NvtxRange again("mlp from fp8 codes");
        mlp_hidden_from_codes(l);
      }
      // The output projection's input, the attention's output, is kept for the attention's
      // backward pass: its FP8 codes are cast from it again into the layers' shared slot.
      if (Fp8Linear* proj = fp8_linear(l, kAttproj)) proj->recast_input(a_.atty[block_slot(l)]);
    }
    if (grad_buckets_) be.zero(grad_bucket(l));
    if (llama)
      llama_block_backward(l);
    else
      gpt2_block_backward(l);
    if (grads_done) grads_done(l);
  }
  // The untied head's bucket, or block 1's, held this room before (GradBucketSizes): landed by now.
  if (grad_buckets_ && !shape_.tied_head) be.zero(grad_bucket(-1));
  be.embedding_backward(g[kWte], g[kWpe], a_.dresidual, a_.tokens);  // g[kWpe] is empty for llama
  if (grads_done) grads_done(-1);
}

void Transformer::gpt2_block_backward(int l) {
  Backend& be = backend_;
  const auto g = [&](ParamId id) { return block_grad(id, l); };
  const int b = block_slot(l), m = fch_slot(l);
  // MLP branch: residual3 = residual2 + fcproj(gelu(fc(ln2(residual2)))).
  if (Fp8Linear* fcproj = fp8_linear(l, kFcproj); fcproj || !fused_gelu_) {
    be.zero(a_.dfch_gelu);
    linear_backward(fcproj, a_.dfch_gelu, g(kMlpDownw), g(kMlpDownb), a_.dresidual, a_.fch_gelu[hidden_slot(l)], block_param(kMlpDownw, l));
    be.zero(a_.dfch);
    be.gelu_backward(a_.dfch, a_.fch[m], a_.dfch_gelu);
  } else {
    be.matmul_gelu_backward(a_.dfch, g(kMlpDownw), g(kMlpDownb), a_.dresidual, a_.fch_gelu[hidden_slot(l)], block_param(kMlpDownw, l),
                            a_.fch[m], a_.dfch_gelu);
  }
  be.zero(a_.dln);
  linear_backward(fp8_linear(l, kFc), a_.dln, g(kMlpUpw), g(kMlpUpb), a_.dfch, a_.ln2[ln2_slot(l)], block_param(kMlpUpw, l));
  be.layernorm_backward(a_.dresidual, g(kNorm2w), g(kNorm2b), a_.dln, a_.residual2[b], block_param(kNorm2w, l), a_.ln2_mean[b],
                        a_.ln2_rstd[b]);
  // Attention branch: residual2 = residual + attproj(attention(qkv(ln1(residual)))).
  be.zero(a_.datty);
  linear_backward(fp8_linear(l, kAttproj), a_.datty, g(kAttnOutw), g(kAttnOutb), a_.dresidual, a_.atty[b],
                  block_param(kAttnOutw, l));
  be.zero(a_.dqkv);
  be.attention_backward(a_.dqkv, a_.datty, a_.qkv[b], a_.atty[b], saved_attention(l), shape_.n_head);
  be.zero(a_.dln);
  linear_backward(fp8_linear(l, kQkv), a_.dln, g(kQkvw), g(kQkvb), a_.dqkv, a_.ln1[ln1_slot(l)], block_param(kQkvw, l));
  be.layernorm_backward(a_.dresidual, g(kNorm1w), g(kNorm1b), a_.dln, residual_in(l), block_param(kNorm1w, l), a_.ln1_mean[b],
                        a_.ln1_rstd[b]);
}

void Transformer::llama_block_backward(int l) {
  Backend& be = backend_;
  const auto g = [&](ParamId id) { return block_grad(id, l); };
  const int b = block_slot(l), m = fch_slot(l);
  // MLP branch: residual3 = residual2 + down(swiglu(gate_up(rmsnorm(residual2)))).
  be.zero(a_.dfch_gelu);
  linear_backward(fp8_linear(l, kFcproj), a_.dfch_gelu, g(kMlpDownw), Tensor(), a_.dresidual, a_.fch_gelu[hidden_slot(l)],
                  block_param(kMlpDownw, l));
  be.zero(a_.dfch);
  be.swiglu_backward(a_.dfch, a_.dfch_gelu, a_.fch[m]);
  be.zero(a_.dln);
  linear_backward(fp8_linear(l, kFc), a_.dln, g(kMlpUpw), Tensor(), a_.dfch, a_.ln2[ln2_slot(l)], block_param(kMlpUpw, l));
  be.rmsnorm_backward(a_.dresidual, g(kNorm2w), a_.dln, a_.residual2[b], block_param(kNorm2w, l), a_.ln2_rstd[b]);
  // Attention branch: residual2 = residual + o_proj(attention(rope(qkv(rmsnorm(residual))))).
  be.zero(a_.datty);
  linear_backward(fp8_linear(l, kAttproj), a_.datty, g(kAttnOutw), Tensor(), a_.dresidual, a_.atty[b],
                  block_param(kAttnOutw, l));
  be.zero(a_.dqkv);
  be.attention_backward(a_.dqkv, a_.datty, a_.qkv[b], a_.atty[b], saved_attention(l), shape_.n_head);
  be.rope_backward(a_.dqkv, rope_table_, shape_.n_head + shape_.kv_heads());
  Tensor dqkv = a_.dqkv;
  if (shape_.qk_norm) {
    be.zero(a_.dqkv_raw);
    be.qk_norm_backward(a_.dqkv_raw, g(kQNormw), g(kKNormw), a_.dqkv, a_.qkv_raw[b], block_param(kQNormw, l),
                        block_param(kKNormw, l), a_.qk_rstd[b], shape_.n_head);
    dqkv = a_.dqkv_raw;
  }
  be.zero(a_.dln);
  linear_backward(fp8_linear(l, kQkv), a_.dln, g(kQkvw), Tensor(), dqkv, a_.ln1[ln1_slot(l)], block_param(kQkvw, l));
  be.rmsnorm_backward(a_.dresidual, g(kNorm1w), a_.dln, residual_in(l), block_param(kNorm1w, l), a_.ln1_rstd[b]);
}

void Transformer::zero_grad() {
  if (!grad_buckets_) backend_.zero(grads_flat_);
}

}  // namespace ptrain
