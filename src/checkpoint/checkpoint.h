// Checkpoints: <dir>/step_NNNNNNNN/ holding the FP32 master weights (weights.safetensors), the
// AdamW moments (optimizer.safetensors) and state.json (step, data position, loss scaler, FP8
// histories and scales, the model config, a SHA-256 per file). A checkpoint is written under a
// temporary name, fsynced and renamed, so it is visible only when complete; then <dir>/latest
// names it. A crash mid-save leaves the previous checkpoints as they were.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"
#include "dist/communicator.h"
#include "model/gpt.h"
#include "optim/adamw.h"
#include "precision/loss_scaler.h"

namespace ptrain {

struct Fp8ScalingState {
  std::string name;
  std::vector<float> history;
  float scale = 1;
};

// Everything a resumed run needs besides the tensors.
struct CheckpointState {
  int64_t step = 0;             // optimizer steps completed (skipped ones included)
  int64_t tokens = 0;           // training tokens consumed
  int64_t optimizer_steps = 0;  // AdamW updates applied (for bias correction)
  LossScaler::State scaler{1.0, 0, 1, 0};
  std::string scaler_mode = "off";  // restored only into a run with the same loss-scaling mode
  std::vector<Fp8ScalingState> fp8;
  double best_val_loss = 0;
  int64_t best_val_step = -1;  // -1: no evaluation yet
  uint64_t data_seed = 0;      // the training sampler: window i starts at hash(seed, i)
  int64_t next_sample = 0;     // the next training window's index
  std::string precision;       // the mode label at save time
  nlohmann::json model;        // the model config section: resume refuses another shape
  nlohmann::json schedule;     // keys that shape the rest of the run: resume warns when they change
};

// ZeRO-1: one rank's AdamW moments ("m", "v") for elements [begin, begin + count) of the flat
// parameter vector.
struct MomentShard {
  int64_t begin = 0, count = 0;
  SafetensorsFile file;
};

struct LoadedCheckpoint {
  std::string path;
  CheckpointState state;
  SafetensorsFile weights;                  // the FP32 master weights, whole
  std::optional<SafetensorsFile> optimizer;  // the moments per tensor, or else:
  std::vector<MomentShard> shards;           // the moments in ZeRO-1 shards, in order
  int64_t sharded_params = 0;                // what the shards cover
};

// Writes the checkpoint of `step` under `dir`, updates `latest`, and removes all but the newest
// `keep_last` checkpoints. Returns its path. Throws UserError on I/O failure; the earlier
// checkpoints and `latest` are then untouched. With a communicator every rank calls it: rank 0
// writes the weights (gathered from the ZeRO-1 shards if need be) and state.json, each rank
// writes its optimizer shard under ZeRO-1, and the checkpoint is renamed into place only after
// every rank's part is on disk; if any rank fails, every rank throws.
std::string save_checkpoint(const std::string& dir, const CheckpointState& state, Gpt& model, AdamW& optimizer,
                            int keep_last, Communicator* comm = nullptr);

// Loads and verifies one checkpoint directory (state.json present and well-formed, every file's
// SHA-256 as recorded). Throws UserError naming the checkpoint and what is wrong.
LoadedCheckpoint load_checkpoint(const std::string& path);

// The newest valid checkpoint under `dir`: invalid ones (corrupt, incomplete) are reported
// through `warn` and skipped. nullopt when there is none.
std::optional<LoadedCheckpoint> find_latest_checkpoint(const std::string& dir,
                                                       const std::function<void(const std::string&)>& warn);

// Renames checkpoints of steps after `step` to <name>.superseded, so that a run resumed from an
// earlier checkpoint never later resumes from the abandoned branch. Returns the new names.
std::vector<std::string> set_aside_later_checkpoints(const std::string& dir, int64_t step);

// Copies checkpoint weights into the model's master weights and refreshes its GEMM copy.
void load_weights(const SafetensorsFile& weights, Gpt& model);

// Copies a loaded checkpoint's tensors into the model (master weights, then the low-precision
// copy) and the optimizer (this rank's shard of the moments, from whichever layout was saved).
// The model config must match (checked by the caller); the model must still hold its master
// weights (before AdamW::adopt_master).
void restore_tensors(const LoadedCheckpoint& checkpoint, Gpt& model, AdamW& optimizer);

// The model keys a checkpoint records and a resume must agree on, and back.
nlohmann::json model_json(const ModelConfig& model);
ModelConfig model_from_json(const nlohmann::json& model);

// The model-config keys whose values differ between two model sections ("model.n_embd 128 vs 256").
std::vector<std::string> model_differences(const nlohmann::json& saved, const nlohmann::json& current);

}  // namespace ptrain
