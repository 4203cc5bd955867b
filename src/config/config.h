// The run config: plain structs with defaults, filled from YAML and `--set` overrides.
// No YAML type escapes this folder. Key names are the public interface (README, "The run config").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/choices.h"

namespace ptrain {

struct RunConfig {
  std::string name = "run";
  std::string out_dir = "runs";
  int64_t seed = 1337;
  DeviceRequest device = DeviceRequest::auto_;
  bool overwrite = false;
};

// The largest model keys a config (or a checkpoint's state) may give: far beyond any model this
// trains, and small enough that parameter counts cannot overflow.
constexpr int kMaxLayers = 1024;
constexpr int kMaxEmbd = 65536;
constexpr int kMaxSeqLen = 1 << 20;
// Ids past 65,535 take uint32 shards; 2^20 is four times the largest vocabulary in use (262,144).
constexpr int kMaxVocab = 1 << 20;

struct ModelConfig {
  int n_layer = 0;  // required
  int n_head = 0;   // required
  int n_embd = 0;   // required
  int seq_len = 0;  // required: the model's context length (position embeddings)
  int vocab_size = 0;  // required
  std::string init_from;  // empty = null
  AttentionRequest attention = AttentionRequest::auto_;
  bool fused_gelu = true;          // GELU in the neighbouring GEMMs' epilogues (GPU: bf16/fp16, non-FP8 layers)
  double init_std = 0.02;  // GPT-2 initialisation (Megatron's --init-method-std)
  // The architecture, and the settings only llama reads.
  Arch arch = Arch::gpt2;
  int n_kv_head = 0;                      // grouped-query attention's K/V heads; 0 = n_head
  double rope_theta = 10000;              // RoPE base (Llama 3: 500000)
  double norm_eps = 1e-5;                 // RMSNorm epsilon
  int mlp_hidden = 0;                     // SwiGLU width; 0 = the Llama rule (swiglu_hidden)
  int mlp_multiple_of = 256;              // the Llama rule rounds up to a multiple of this
  TieEmbeddings tie_embeddings = TieEmbeddings::auto_;  // auto: gpt2 tied, llama not
  bool qk_norm = false;                   // llama: RMSNorm on each q and k head (before RoPE)

  // Vocabulary padded to a multiple of 128 (the padded logits never win, never get gradient).
  int padded_vocab() const { return (vocab_size + 127) / 128 * 128; }
  int kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  // Llama's SwiGLU width: mlp_hidden, or 2/3 of 4 n_embd rounded up to mlp_multiple_of.
  int swiglu_hidden() const {
    if (mlp_hidden > 0) return mlp_hidden;
    const int64_t two_thirds = int64_t{8} * n_embd / 3, m = mlp_multiple_of > 0 ? mlp_multiple_of : 1;
    return static_cast<int>((two_thirds + m - 1) / m * m);
  }
};

struct SyntheticDataConfig {
  int vocab = 256;
  int order = 2;
  int branching = 4;
  int64_t tokens = 1000000;
  int64_t seed = 1;
  double val_fraction = 0.1;
};

// One of data.sources: training shards and how much of the training batches they make.
struct DataSource {
  std::string train;  // glob of llm.c token shards
  double weight = 0;  // relative to the other sources' (>= 0, not all 0)
};

struct DataConfig {
  std::string train;  // glob of llm.c token shards
  std::vector<DataSource> sources;  // instead of train: a weighted blend of shard globs
  std::string val;    // glob of llm.c token shards
  // What made the shards. auto reads the shards' ptrain-tokenizer.json (the run plan holds what it
  // resolved to).
  TokenizerChoice tokenizer = TokenizerChoice::auto_;
  // gpt2: the vocabulary the shards were made with (data prepare --vocab: a .tiktoken file or a
  // directory with vocab.json and merges.txt); "" = the default one the install fetched.
  std::string vocab;
  bool synthetic_enabled = false;  // true when the config has data.synthetic
  SyntheticDataConfig synthetic;
};

// training.guard (optim/divergence_guard.h): what a non-finite or spiking loss makes the run do.
struct GuardConfig {
  GuardAction action = GuardAction::stop;
  double spike_zscore = 0;      // 0 = spikes not watched (non-finite losses always are)
  int window = 50;              // accepted losses the z-score is measured against
  int spike_steps = 3;          // consecutive spiking steps before the guard acts
  int max_skips = 10;           // skip: this many skipped updates in a row stop the run
  int64_t fallback_steps = 0;   // rollback: steps trained in bf16 after it; 0 = the rest of the run
};

struct TrainingConfig {
  int64_t steps = 500;
  int64_t batch_tokens = 8192;
  int micro_batch = 16;
  int seq_len = 0;  // 0 = model.seq_len; may be shorter than the model's context
  double grad_clip = 1.0;  // 0 disables clipping
  int64_t eval_every = 100;  // 0 = only at the end
  int eval_batches = 20;
  int threads = 0;  // CPU threads; 0 = all available
  double loss_weight = 1.0;  // multiplies the loss, hence every gradient; the logged loss is unweighted
  bool cuda_graph = false;   // GPU: record each kind of micro-batch once, replay it as one CUDA graph
  Recompute recompute = Recompute::none;  // activation recomputation (model/transformer.h)
  GuardConfig guard = {};

  int effective_seq_len(const ModelConfig& m) const { return seq_len > 0 ? seq_len : m.seq_len; }
};

struct OptimizerConfig {
  double lr = 1.0e-3;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1.0e-8;
  double weight_decay = 0.1;
};

struct ScheduleConfig {
  int64_t warmup_steps = 50;
  Decay decay = Decay::cosine;
  double min_lr_ratio = 0.1;
  double wsd_decay_fraction = 0.2;  // wsd: share of the steps spent decaying at the end
};

struct Fp8Config {
  Fp8Recipe recipe = Fp8Recipe::delayed;
  Fp8Format format = Fp8Format::hybrid;
  int margin = 0;
  int amax_history = 16;
  AmaxAlgo amax_algo = AmaxAlgo::max;
  bool bf16_first_last = false;
  bool bf16_lm_head = true;
  bool primary_weights = false;  // the block linears' working weights only as FP8 codes
  bool mlp_input_codes = false;  // the MLP's pre-activation kept for backward as FP8 codes
  int block_size = 128;  // block recipe: 1 x 128 tiles, 128 x 128 weight blocks
};

struct LossScalingConfig {
  LossScalingMode mode = LossScalingMode::auto_;
  double init = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  int hysteresis = 1;
  double min_scale = 1.0;
};

// One phase of precision.schedule: its mode and FP8 settings (precision.fp8 with the phase's own
// fp8 keys over it) until the end of step until_step, or of step floor(until_fraction *
// training.steps); the last phase has neither and runs to the end.
struct PrecisionPhase {
  int64_t until_step = 0;     // 0: not given
  double until_fraction = 0;  // 0: not given
  PrecisionMode mode = PrecisionMode::bf16;  // bf16 | fp8: the modes that store every tensor alike
  Fp8Config fp8;
};

struct PrecisionConfig {
  PrecisionMode mode = PrecisionMode::fp32;  // with a schedule, its first phase's
  bool tf32 = false;
  Fp8Config fp8;
  LossScalingConfig loss_scaling;
  std::vector<PrecisionPhase> schedule;  // empty: `mode` for the whole run
};

// The last step of `phase` in a run of `steps` steps (the last phase: `steps`).
int64_t phase_last_step(const PrecisionPhase& phase, int64_t steps);
// The precision of phase i of p.schedule as a config of its own (no schedule): the phase's mode
// and fp8 settings with p's tf32 and loss scaling.
PrecisionConfig phase_precision(const PrecisionConfig& p, size_t i);

struct CheckpointConfig {
  int64_t every = 0;
  int keep_last = 3;
  std::string resume = "never";  // never | auto | PATH
  bool resume_never() const { return resume == "never"; }
  bool resume_auto() const { return resume == "auto"; }
  std::string dir;  // empty = <run dir>/checkpoints
  bool save_final = true;  // save a checkpoint after the last step
  OnSaveError on_save_error = OnSaveError::stop;  // what a failed save (full disk) does
};

struct LoggingConfig {
  int64_t every = 1;
  int64_t numerics_every = 50;
  int64_t sample_every = 0;  // steps between printed samples (rank 0, its own RNG); 0 = none
  int sample_tokens = 64;
  std::string sample_prompt;  // "" = a document's start
  double sample_temperature = 0.8;  // 0 = greedy
};

struct DistributedConfig {
  int zero_stage = 0;
  GradReduceDtype grad_reduce_dtype = GradReduceDtype::fp32;  // what gradients travel between ranks as
};

struct Config {
  RunConfig run;
  ModelConfig model;
  DataConfig data;
  TrainingConfig training;
  OptimizerConfig optimizer;
  ScheduleConfig schedule;
  PrecisionConfig precision;
  CheckpointConfig checkpoint;
  LoggingConfig logging;
  DistributedConfig distributed;
};

// A run config is a page of YAML: anything larger is not one.
constexpr int64_t kMaxConfigBytes = 1 << 20;

// Reads a YAML config file (a regular file or a pipe, at most kMaxConfigBytes), applies `section.key=value` overrides, validates everything and
// returns the resolved config. Throws UserErrors listing every problem found (each naming the
// key, the file:line:column or the --set flag, what was wrong and what was expected).
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});

// Same, from YAML text (tests, and configs generated by other commands). `origin` names the
// text in messages (a file name).
Config parse_config(const std::string& yaml_text, const std::string& origin,
                    const std::vector<std::string>& overrides = {});

// The resolved config as YAML, every key present (written to <run dir>/config.yaml; parsing
// it back gives the same Config).
std::string config_to_yaml(const Config& config);

}  // namespace ptrain
