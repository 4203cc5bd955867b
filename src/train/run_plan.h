// Everything a training run depends on, resolved and checked before its first byte is written:
// the data files (headers and sizes; tokens are checked as they are read), the resume checkpoint
// (loaded and verified), the init_from model, the run directory (what happens to it) and the
// checkpoint directory (whose it is), the memory the run needs and the thread count. plan_run()
// writes nothing; `--dry-run` prints the plan, and `train` carries it out. So a dry run performs
// every check the real run performs, and a run refused with exit 2 has changed nothing on disk.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/llmc.h"
#include "config/config.h"
#include "data/dataset.h"
#include "data/tokenizer.h"
#include "data/synthetic.h"
#include "precision/policy.h"
#include "train/run_spec.h"
#include "train/step_faults.h"

namespace ptrain {

// Marks a directory as a ptrain run directory, the only kind run.overwrite may delete.
constexpr const char* kRunMarker = ".ptrain-run";

// Where training samples come from: data.train (one source of weight 1), or each of data.sources.
struct TrainSource {
  std::string key;      // "data.train" or "data.sources[N].train", for messages
  std::string pattern;  // the glob its files matched
  double weight = 1;    // as configured: relative to the other sources'
  std::vector<std::string> files;
};

struct DataPlan {
  std::vector<TrainSource> sources;
  std::vector<std::string> train_files, val_files;  // exact paths (train: every source's, in
                                                    // order): nothing is globbed after planning
  std::optional<SyntheticSpec> synthetic;           // a corpus to generate into <run dir>/data first
  std::optional<SyntheticInfo> info;                // the source of the val shards, when known
  std::string tokenizer;                            // bytes, gpt2, or "" unknown (data.tokenizer resolved)
  std::string vocabulary_sha256;                    // the shards' records', "" without one (and for bytes)
  std::optional<Tokenizer> sample_tokenizer;        // loaded for logging.sample_every when known
  std::vector<int32_t> sample_prompt;               // logging.sample_prompt encoded
  // The shards opened and checked, train's one stream per source (not yet for a corpus still to
  // generate).
  std::vector<TokenStream> train;
  std::optional<TokenStream> val;
  // What the trainer samples from: train's streams, blended by the sources' weights.
  TrainSampler train_sampler(uint64_t seed, int seq_len) const;
  // Opens the train sources' streams and checks their formats against each other.
  void open_train(int vocab_size);
};

// "N tokens in S shard(s)", and with several sources each one's glob, share and tokens.
std::string train_sources_text(const DataPlan& data);

// What the run does to <out_dir>/<name>.
enum class RunDirAction {
  create,        // new
  replace,       // run.overwrite: an earlier ptrain run directory is deleted, then made afresh
  continue_run,  // a resume (or resume: auto) continues the run in its directory
};

// What the CPU backend allocates for a run: every format is emulated in float storage.
struct MemoryPlan {
  int64_t params, master, grads, optimizer, activations, fp8;
  int64_t exchange = 0;  // a bf16 gradient exchange's staging blocks
  int64_t total() const { return params + master + grads + optimizer + activations + fp8 + exchange; }
  std::string describe() const;
};
// The CPU backend's memory for one rank of spec's world size under `distributed` (the ZeRO
// stage, the gradient exchange's format).
MemoryPlan plan_memory(const RunSpec& spec, const DistributedConfig& distributed);

// The weights model.init_from starts from, in ptrain's flat parameter order, and what they were
// read from (for the log: "llm.c model file, version 3", "Hugging Face llama directory, ...").
struct InitWeights {
  std::vector<float> params;
  std::string source;
};

struct RunPlan {
  Config config;
  std::string run_dir;
  RunDirAction run_dir_action = RunDirAction::create;
  std::string checkpoint_dir;
  bool checkpoint_dir_is_explicit = false;  // checkpoint.dir set (else <run dir>/checkpoints)
  bool clear_checkpoint_dir = false;        // run.overwrite of a run whose explicit checkpoint.dir it owned
  DataPlan data;
  std::optional<LoadedCheckpoint> resume;
  std::vector<std::string> superseded;  // checkpoints the run's first checkpoint sets aside: those after
                                        // the resumed one, or all unusable ones when auto starts afresh
  std::optional<InitWeights> init_from;
  int threads = 0;       // CPU threads: training.threads, at most the cores available (0 = all)
  int world_size = 1;    // ranks, from the launcher's environment (or planned: train --dry-run --ranks)
  std::vector<std::string> warnings;         // shown at once, and logged once the log exists
  std::vector<std::string> resume_warnings;  // checkpoints resume: auto skipped (shown at once, logged)
  RunSpec spec;                              // the config resolved (after world_size is known)
  StepFaults faults;                         // PTRAIN_TEST_FAULT (tests only)
};

// Checks everything and returns the plan, or throws UserError(s) naming each problem (and
// EnvironmentError for what the machine lacks). Reads, never writes. planned_ranks > 0 plans
// that many data-parallel ranks in one process (a dry run's --ranks) instead of the launcher's.
RunPlan plan_run(const Config& config, int planned_ranks = 0);

// What `--dry-run` prints after the resolved config: parameters, memory, data, directories,
// checkpoint to resume from, what will be created or replaced.
std::string describe_plan(const RunPlan& plan);

}  // namespace ptrain
