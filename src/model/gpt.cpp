#include "model/gpt.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/rng.h"
#include "metrics/nvtx.h"

namespace ptrain {

static int64_t product(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

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
    for (const auto& e : entries) total += (product(e.shape) * dtype_size(e.dtype) + 63) / 64 * 64;
    return total;
  }
};

// Activations and their gradients take the policy's formats; layernorm statistics and the
// per-token losses stay FP32, as in every mixed-precision recipe. `storage` maps a format to the
// backend's storage dtype.
template <typename Storage>
ActivationPlan plan_activations(GptActivations& a, const GptShape& s, int B, int T, Format act, Format grad,
                                AttentionPath attention, Storage storage) {
  const int64_t L = s.n_layer, C = s.n_embd, NH = s.n_head;
  ActivationPlan p;
  auto add = [&](Tensor* slot, std::vector<int64_t> shape, Format f) {
    p.entries.push_back({slot, std::move(shape), storage(f), f});
  };
  auto add_tokens = [&](Tensor* slot) { p.entries.push_back({slot, {B, T}, DType::i32, Format::fp32}); };
  const Format fp32 = Format::fp32;
  add_tokens(&a.tokens);
  add_tokens(&a.targets);
  add(&a.encoded, {B, T, C}, act);
  add(&a.ln1, {L, B, T, C}, act);
  add(&a.ln1_mean, {L, B, T}, fp32);
  add(&a.ln1_rstd, {L, B, T}, fp32);
  add(&a.qkv, {L, B, T, 3 * C}, act);
  add(&a.atty, {L, B, T, C}, act);
  if (attention == AttentionPath::fused)  // a log-sum-exp per row (the fused backward recomputes the
    // rest), each layer's rows padded to 16 bytes: cuDNN reads 16-byte aligned tensors
    add(&a.att, {L, (int64_t{B} * NH * T + 3) / 4 * 4}, fp32);
  else
    add(&a.att, {L, B, NH, T, T}, act);
  add(&a.attproj, {L, B, T, C}, act);
  add(&a.residual2, {L, B, T, C}, act);
  add(&a.ln2, {L, B, T, C}, act);
  add(&a.ln2_mean, {L, B, T}, fp32);
  add(&a.ln2_rstd, {L, B, T}, fp32);
  add(&a.fch, {L, B, T, 4 * C}, act);
  add(&a.fch_gelu, {L, B, T, 4 * C}, act);
  add(&a.fcproj, {L, B, T, C}, act);
  add(&a.residual3, {L, B, T, C}, act);
  add(&a.lnf, {B, T, C}, act);
  add(&a.lnf_mean, {B, T}, fp32);
  add(&a.lnf_rstd, {B, T}, fp32);
  add(&a.logits, {B, T, s.padded_vocab}, grad);  // overwritten in place by its gradient
  add(&a.losses, {B, T}, fp32);
  add(&a.dresidual, {B, T, C}, grad);
  add(&a.dln, {B, T, C}, grad);
  add(&a.datty, {B, T, C}, grad);
  add(&a.dfch_gelu, {B, T, 4 * C}, grad);
  add(&a.dfch, {B, T, 4 * C}, grad);
  add(&a.dqkv, {B, T, 3 * C}, grad);
  return p;
}
}  // namespace

int64_t gpt_activation_bytes(const GptShape& s, int B, int T, size_t elem) {
  GptActivations unused;
  const DType dt = elem == 8 ? DType::f64 : DType::f32;
  return plan_activations(unused, s, B, T, Format::fp32, Format::fp32, AttentionPath::fallback,
                         [dt](Format) { return dt; })
      .bytes();
}

int64_t gpt_activation_bytes(const GptShape& s, int B, int T, Format act, Format grad, AttentionPath attention,
                             const std::function<DType(Format)>& storage) {
  GptActivations unused;
  return plan_activations(unused, s, B, T, act, grad, attention, storage).bytes();
}

// (C, OC) of the four linears of a block, in LinearId order.
static std::array<std::array<int64_t, 2>, kLinearsPerBlock> block_linear_shapes(const GptShape& s) {
  const int64_t C = s.n_embd;
  return {{{C, 3 * C}, {C, C}, {C, 4 * C}, {4 * C, C}}};
}

int64_t gpt_fp8_buffer_bytes(const GptShape& s, const PrecisionPolicy& policy, int B, int T) {
  if (!policy.fp8.enabled) return 0;
  const int64_t rows = int64_t{B} * T;
  int64_t bytes = 0;
  for (int l = 0; l < s.n_layer; ++l)
    if (policy.fp8_block(l, s.n_layer))
      for (const auto& [C, OC] : block_linear_shapes(s)) bytes += Fp8Linear::buffer_bytes(policy.fp8, rows, C, OC);
  if (!policy.fp8.bf16_lm_head) bytes += Fp8Linear::buffer_bytes(policy.fp8, rows, s.n_embd, s.padded_vocab);
  return bytes;
}

Gpt::Gpt(const GptShape& shape, Backend& backend, DType dtype, int B, int T, const PrecisionPolicy& policy,
         AttentionPath attention, bool fused_gelu)
    : shape_(shape),
      backend_(backend),
      dtype_(dtype),
      B_(B),
      T_(T),
      specs_(gpt_param_specs(shape)),
      attention_(attention),
      fused_gelu_(fused_gelu) {
  PTRAIN_CHECK(T <= shape.max_seq_len, "sequence longer than the model's context");
  const int64_t n = gpt_num_params(shape);
  auto storage = [&](Format f) { return backend.storage_for(f, dtype); };
  auto flat = [&](Format f) {
    const DType dt = storage(f);
    return Tensor(backend.allocate(static_cast<size_t>(n) * dtype_size(dt)), dt, {n}, backend.device()).with_format(f);
  };
  params_flat_ = flat(policy.weights);
  grads_flat_ = flat(policy.grads);
  has_master_ = policy.has_master_weights();
  if (has_master_) master_flat_ = flat(Format::fp32);
  if (policy.grads != Format::fp32) accum_flat_ = flat(Format::fp32);
  int64_t offset = 0;
  for (int i = 0; i < kNumParams; ++i) {
    const int64_t count = product(specs_[i].shape);
    params_[i] = params_flat_.range(offset, count).reshaped(specs_[i].shape);
    grads_[i] = grads_flat_.range(offset, count).reshaped(specs_[i].shape);
    if (!accum_flat_.empty()) accum_[i] = accum_flat_.range(offset, count).reshaped(specs_[i].shape);
    offset += count;
  }

  ActivationPlan plan = plan_activations(a_, shape, B, T, policy.activations, policy.grads, attention, storage);
  act_bytes_ = plan.bytes();
  act_memory_ = backend.allocate(act_bytes_);
  char* cursor = static_cast<char*>(act_memory_);
  for (auto& e : plan.entries) {
    *e.slot = Tensor(cursor, e.dtype, e.shape, backend.device()).with_format(e.format);
    cursor += (e.slot->bytes() + 63) / 64 * 64;
  }

  for (int l = 0; l < shape.n_layer; ++l) block_names_.push_back("block " + std::to_string(l));

  // FP8 for the four linears of each block (unless kept in bf16), and the LM head if asked.
  const int64_t rows = int64_t{B} * T;
  const auto linear_shapes = block_linear_shapes(shape);
  const char* linear_names[kLinearsPerBlock] = {"qkv", "attproj", "fc", "fcproj"};
  if (policy.fp8.enabled) {
    for (int l = 0; l < shape.n_layer; ++l)
      for (int k = 0; k < kLinearsPerBlock; ++k)
        fp8_.push_back(policy.fp8_block(l, shape.n_layer)
                           ? std::make_unique<Fp8Linear>("h" + std::to_string(l) + "." + linear_names[k], policy.fp8,
                                                         backend, rows, linear_shapes[k][0], linear_shapes[k][1])
                           : nullptr);
    fp8_.push_back(policy.fp8.bf16_lm_head ? nullptr
                                           : std::make_unique<Fp8Linear>("lm_head", policy.fp8, backend, rows,
                                                                         shape.n_embd, shape.padded_vocab));
  }
}

Gpt::~Gpt() {
  backend_.release(act_memory_);
  backend_.release(grads_flat_.data);
  if (!accum_flat_.empty()) backend_.release(accum_flat_.data);
  backend_.release(params_flat_.data);
  if (!master_flat_.empty()) backend_.release(master_flat_.data);
}

Tensor Gpt::master(ParamId id) const {
  if (master_flat_.empty()) return params_[id];
  const int64_t offset = (static_cast<const char*>(params_[id].data) - params_flat_.as<char>()) /
                         static_cast<int64_t>(dtype_size(params_flat_.dtype));
  return master_flat_.range(offset, params_[id].numel()).reshaped(specs_[id].shape);
}

void Gpt::release_master() {
  if (master_flat_.empty()) return;
  backend_.release(master_flat_.data);
  master_flat_ = Tensor();
}

void Gpt::sync_params_from_master() {
  if (!master_flat_.empty()) backend_.copy(params_flat_, master_flat_);
}

Fp8Linear* Gpt::lm_head_fp8() const { return fp8_.empty() ? nullptr : fp8_.back().get(); }

Fp8Linear* Gpt::fp8_linear(int layer, LinearId which) const {
  if (fp8_.empty()) return nullptr;
  return fp8_[static_cast<size_t>(layer) * kLinearsPerBlock + which].get();
}

void Gpt::linear_forward(Fp8Linear* fp8, Tensor out, Tensor inp, Tensor weight, Tensor bias, bool training) {
  if (fp8)
    fp8->forward(out, inp, weight, bias, training);
  else
    backend_.matmul_forward(out, inp, weight, bias);
}

void Gpt::linear_backward(Fp8Linear* fp8, Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp,
                          Tensor weight) {
  if (fp8)
    fp8->backward(dinp, dweight, dbias, dout);
  else
    backend_.matmul_backward(dinp, dweight, dbias, dout, inp, weight);
}

void Gpt::queue_fp8_settle() {
  for (auto& f : fp8_)
    if (f) f->queue_settle();
}

void Gpt::end_step() {
  queue_fp8_settle();
  for (auto& f : fp8_)
    if (f) f->end_step();
}

std::vector<Fp8TensorState*> Gpt::fp8_tensors() {
  queue_fp8_settle();
  std::vector<Fp8TensorState*> all;
  for (auto& f : fp8_)
    if (f)
      for (Fp8TensorState* t : f->tensors()) all.push_back(t);
  return all;
}

Tensor Gpt::saved_attention(int layer) const {
  if (attention_ == AttentionPath::fallback) return a_.att[layer];
  const int64_t rows = int64_t{B_} * shape_.n_head * T_;
  return a_.att[layer].range(0, rows).reshaped({B_, shape_.n_head, T_});
}

std::string Gpt::fp8_gemm_summary() const {
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
  return line;
}

void Gpt::init(uint64_t seed, double std) {
  const double residual_std = std / std::sqrt(2.0 * shape_.n_layer);
  for (int i = 0; i < kNumParams; ++i) {
    const Tensor& t = params_[i];
    std::vector<float> host(t.numel(), 0.0f);
    const bool is_layernorm_weight = (i == kLn1w || i == kLn2w || i == kLnfw);
    if (is_layernorm_weight) {
      std::fill(host.begin(), host.end(), 1.0f);
    } else if (specs_[i].weight_decay) {  // the 2-D weights
      const double tensor_std = (i == kAttprojw || i == kFcprojw) ? residual_std : std;
      // Padded vocabulary rows stay zero: they never win a softmax and get no gradient.
      const int64_t count = (i == kWte) ? int64_t{shape_.vocab} * shape_.n_embd : t.numel();
      Rng rng(seed, static_cast<uint64_t>(i));
      for (int64_t j = 0; j < count; ++j) host[j] = static_cast<float>(rng.normal() * tensor_std);
    }
    backend_.upload(master(static_cast<ParamId>(i)), host.data());
  }
  // The master weights hold the values; the GEMMs' copy is them rounded to its format.
  sync_params_from_master();
}

Tensor Gpt::residual_in(int layer) const {
  return layer == 0 ? a_.encoded : a_.residual3[layer - 1];
}

double Gpt::forward(const int32_t* inputs, const int32_t* targets, float dloss) {
  load_batch(inputs, targets);
  forward_loss(dloss);
  return backend_.sum(a_.losses) / static_cast<double>(a_.losses.numel());
}

// Checked on the host: a replayed micro-batch runs no host-side check of its own, and an id past
// the vocabulary would make the embedding read and write outside its table.
void Gpt::check_tokens(const int32_t* ids, int64_t n, const char* what) const {
  for (int64_t i = 0; i < n; ++i)
    if (ids[i] < 0 || ids[i] >= shape_.vocab)
      throw UserError(std::string(what) + " token id " + std::to_string(ids[i]) + " at position " + std::to_string(i) +
                      " of the micro-batch is outside the vocabulary [0, " + std::to_string(shape_.vocab) + ")");
}

void Gpt::load_batch(const int32_t* inputs, const int32_t* targets) {
  decoded_ = 0;  // a replayed micro-batch overwrites the activations without forward_pass
  const int64_t n = int64_t{B_} * T_;
  check_tokens(inputs, n, "input");
  check_tokens(targets, n, "target");
  backend_.upload_tokens(a_.tokens, inputs);
  backend_.upload_tokens(a_.targets, targets);
}

void Gpt::forward_loss(float dloss) {
  const bool training = dloss != 0;
  forward_logits(training);
  backend_.classifier(a_.logits, a_.losses, a_.targets, shape_.vocab, dloss);
  grads_ready_ = training;
}

void Gpt::train_micro_batch(const int32_t* inputs, const int32_t* targets, float dloss, Tensor loss_sum,
                            const std::function<void(int block)>& grads_done) {
  PTRAIN_CHECK(dloss != 0, "train_micro_batch needs a loss gradient (dloss != 0)");
  load_batch(inputs, targets);
  if (recording_on_ && !grads_done) {
    run_recorded(dloss);
  } else {
    forward_and_backward(dloss, grads_done);
  }
  backend_.sum_into(loss_sum, a_.losses);
}

void Gpt::forward_and_backward(float dloss, const std::function<void(int block)>& grads_done) {
  {
    NvtxRange range("forward");
    forward_loss(dloss);
  }
  NvtxRange range("backward");
  backward(grads_done);
}

std::string Gpt::record_micro_batches() {
  std::string why = backend_.cannot_record();
  for (const auto& f : fp8_)
    if (why.empty() && f) why = f->unrecordable();
  recording_on_ = why.empty();
  return why;
}

Gpt::HostProgress Gpt::host_progress(float dloss) const {
  HostProgress p;
  std::memcpy(&p.dloss_bits, &dloss, sizeof dloss);
  p.grads_ready = grads_ready_;
  for (const auto& f : fp8_) p.fp8.push_back(f ? f->host_state() : Fp8Linear::HostState{});
  return p;
}

void Gpt::restore(const HostProgress& progress) {
  grads_ready_ = progress.grads_ready;
  for (size_t i = 0; i < fp8_.size(); ++i)
    if (fp8_[i]) fp8_[i]->restore(progress.fp8[i]);
}

void Gpt::run_recorded(float dloss) {
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

void Gpt::replay(Recording& recording) {
  NvtxRange range("forward and backward (CUDA graph replay)");
  recording.work->replay();
  restore(recording.after);
  ++replays_;
}

std::vector<float> Gpt::logits_at(int position) const {
  std::vector<float> row(static_cast<size_t>(shape_.padded_vocab));
  backend_.download(row.data(), a_.logits[0][position]);
  row.resize(static_cast<size_t>(shape_.vocab));
  return row;
}

std::vector<float> Gpt::start_decoding(const int32_t* tokens, int length) {
  PTRAIN_CHECK(length >= 1 && length <= T_, "decoding starts from 1 to seq_len tokens");
  PTRAIN_CHECK(fp8_.empty(), "decoding runs without FP8 linears");
  check_tokens(tokens, length, "prompt");
  // Every sequence of the micro-batch runs; only sequence 0's first `length` positions count.
  std::vector<int32_t> window(static_cast<size_t>(B_) * T_, 0);
  std::copy(tokens, tokens + length, window.begin());
  backend_.upload_tokens(a_.tokens, window.data());
  forward_logits(/*training=*/false);
  decoded_ = length;
  return logits_at(length - 1);
}

std::vector<float> Gpt::decode_next(int32_t token) {
  PTRAIN_CHECK(decoded_ > 0, "decode_next needs start_decoding first");
  PTRAIN_CHECK(decoded_ < T_, "decoding is at the model's context length");
  check_tokens(&token, 1, "decoded");
  const int position = decoded_;
  backend_.upload_tokens(a_.tokens[0].range(position, 1).reshaped({1, 1}), &token);
  forward_pass(position, /*training=*/false);
  decoded_ = position + 1;
  return logits_at(position);
}

void Gpt::forward_pass(int position, bool training) {
  const int L = shape_.n_layer, NH = shape_.n_head;
  const int64_t C = shape_.n_embd;
  Backend& be = backend_;
  const bool whole = position < 0;
  decoded_ = 0;
  // What the pass reads and writes: a whole (B,T,...) activation, or position `position` of
  // sequence 0 as a (1,1,width) row.
  const auto at = [&](Tensor t) {
    if (whole) return t;
    const Tensor sequence = t[0];
    const int64_t width = sequence.numel() / T_;
    return sequence.range(position * width, width).reshaped({1, 1, width});
  };
  const auto attention = [&](int l) {
    if (whole) return be.attention_forward(a_.atty[l], saved_attention(l), a_.qkv[l], NH);
    const Tensor cached = a_.qkv[l][0].range(0, (position + 1) * 3 * C).reshaped({position + 1, 3 * C});
    be.attention_decode(at(a_.atty[l]), cached, NH);
  };
  const Tensor wpe = whole ? params_[kWpe] : params_[kWpe][position].reshaped({1, C});

  be.embedding_forward(at(a_.encoded), at(a_.tokens), params_[kWte], wpe);
  for (int l = 0; l < L; ++l) {
    NvtxRange range(block_names_[l].c_str());
    const Tensor x = at(residual_in(l)), ln1 = at(a_.ln1[l]), qkv = at(a_.qkv[l]), atty = at(a_.atty[l]);
    const Tensor attproj = at(a_.attproj[l]), residual2 = at(a_.residual2[l]), ln2 = at(a_.ln2[l]);
    const Tensor fch = at(a_.fch[l]), fch_gelu = at(a_.fch_gelu[l]), fcproj = at(a_.fcproj[l]);
    be.layernorm_forward(ln1, at(a_.ln1_mean[l]), at(a_.ln1_rstd[l]), x, params_[kLn1w][l], params_[kLn1b][l]);
    linear_forward(fp8_linear(l, kQkv), qkv, ln1, params_[kQkvw][l], params_[kQkvb][l], training);
    attention(l);
    linear_forward(fp8_linear(l, kAttproj), attproj, atty, params_[kAttprojw][l], params_[kAttprojb][l], training);
    be.add(residual2, x, attproj);
    be.layernorm_forward(ln2, at(a_.ln2_mean[l]), at(a_.ln2_rstd[l]), residual2, params_[kLn2w][l], params_[kLn2b][l]);
    if (Fp8Linear* fc = fp8_linear(l, kFc); fc || !fused_gelu_) {
      linear_forward(fc, fch, ln2, params_[kFcw][l], params_[kFcb][l], training);
      be.gelu_forward(fch_gelu, fch);
    } else {
      be.matmul_gelu_forward(fch_gelu, fch, ln2, params_[kFcw][l], params_[kFcb][l]);
    }
    linear_forward(fp8_linear(l, kFcproj), fcproj, fch_gelu, params_[kFcprojw][l], params_[kFcprojb][l], training);
    be.add(at(a_.residual3[l]), residual2, fcproj);
  }
  const Tensor lnf = at(a_.lnf);
  be.layernorm_forward(lnf, at(a_.lnf_mean), at(a_.lnf_rstd), at(residual_in(L)), params_[kLnfw], params_[kLnfb]);
  linear_forward(lm_head_fp8(), at(a_.logits), lnf, params_[kWte], Tensor(), training);
}

// Parameters stacked over blocks (the per-block slices) and the rest.
static bool is_block_param(int id) { return id != kWte && id != kWpe && id != kLnfw && id != kLnfb; }

std::vector<Tensor> Gpt::block_grads(int block) const {
  std::vector<Tensor> out;
  for (int i = 0; i < kNumParams; ++i) {
    const Tensor g = grad(static_cast<ParamId>(i));
    if (block >= 0 && is_block_param(i)) out.push_back(g[block]);
    if (block < 0 && !is_block_param(i)) out.push_back(g);
  }
  return out;
}

void Gpt::backward(const std::function<void(int block)>& grads_done) {
  PTRAIN_CHECK(grads_ready_, "backward() needs a forward() with dloss != 0 first");
  // With a callback, each block's gradients go into the FP32 sums as soon as they are written.
  const auto finish = [&](int block) {
    if (!grads_done) return;
    if (!accum_flat_.empty())
      for (int i = 0; i < kNumParams; ++i) {
        if (is_block_param(i) != (block >= 0)) continue;
        const Tensor g = block >= 0 ? grads_[i][block] : grads_[i];
        const Tensor sum = block >= 0 ? accum_[i][block] : accum_[i];
        backend_.add(sum, sum, g);
        backend_.zero(g);
      }
    grads_done(block);
  };
  grads_ready_ = false;
  const int L = shape_.n_layer, NH = shape_.n_head;
  Backend& be = backend_;
  auto& g = grads_;
  auto& p = params_;

  // LM head (tied to wte) and the final layernorm; dresidual collects the residual stream's
  // gradient from here down to the embedding.
  be.zero(a_.dln);
  linear_backward(lm_head_fp8(), a_.dln, g[kWte], Tensor(), a_.logits, a_.lnf, p[kWte]);
  be.zero(a_.dresidual);
  be.layernorm_backward(a_.dresidual, g[kLnfw], g[kLnfb], a_.dln, residual_in(L), p[kLnfw], a_.lnf_mean, a_.lnf_rstd);

  for (int l = L - 1; l >= 0; --l) {
    NvtxRange range(block_names_[l].c_str());
    // MLP branch: residual3 = residual2 + fcproj(gelu(fc(ln2(residual2)))).
    if (Fp8Linear* fcproj = fp8_linear(l, kFcproj); fcproj || !fused_gelu_) {
      be.zero(a_.dfch_gelu);
      linear_backward(fcproj, a_.dfch_gelu, g[kFcprojw][l], g[kFcprojb][l], a_.dresidual, a_.fch_gelu[l],
                      p[kFcprojw][l]);
      be.zero(a_.dfch);
      be.gelu_backward(a_.dfch, a_.fch[l], a_.dfch_gelu);
    } else {
      be.matmul_gelu_backward(a_.dfch, g[kFcprojw][l], g[kFcprojb][l], a_.dresidual, a_.fch_gelu[l], p[kFcprojw][l],
                              a_.fch[l], a_.dfch_gelu);
    }
    be.zero(a_.dln);
    linear_backward(fp8_linear(l, kFc), a_.dln, g[kFcw][l], g[kFcb][l], a_.dfch, a_.ln2[l], p[kFcw][l]);
    be.layernorm_backward(a_.dresidual, g[kLn2w][l], g[kLn2b][l], a_.dln, a_.residual2[l], p[kLn2w][l], a_.ln2_mean[l], a_.ln2_rstd[l]);
    // Attention branch: residual2 = residual + attproj(attention(qkv(ln1(residual)))).
    be.zero(a_.datty);
    linear_backward(fp8_linear(l, kAttproj), a_.datty, g[kAttprojw][l], g[kAttprojb][l], a_.dresidual, a_.atty[l],
                    p[kAttprojw][l]);
    be.zero(a_.dqkv);
    be.attention_backward(a_.dqkv, a_.datty, a_.qkv[l], a_.atty[l], saved_attention(l), NH);
    be.zero(a_.dln);
    linear_backward(fp8_linear(l, kQkv), a_.dln, g[kQkvw][l], g[kQkvb][l], a_.dqkv, a_.ln1[l], p[kQkvw][l]);
    be.layernorm_backward(a_.dresidual, g[kLn1w][l], g[kLn1b][l], a_.dln, residual_in(l), p[kLn1w][l], a_.ln1_mean[l], a_.ln1_rstd[l]);
    finish(l);
  }
  be.embedding_backward(g[kWte], g[kWpe], a_.dresidual, a_.tokens);
  if (grads_done) return finish(-1);
  if (!accum_flat_.empty()) {  // this micro-batch's gradients into the FP32 sums
    be.add(accum_flat_, accum_flat_, grads_flat_);
    be.zero(grads_flat_);
  }
}

// With an accumulator, backward() leaves the per-micro-batch gradients zeroed behind it.
void Gpt::zero_grad() { backend_.zero(accum_flat_.empty() ? grads_flat_ : accum_flat_); }

}  // namespace ptrain
