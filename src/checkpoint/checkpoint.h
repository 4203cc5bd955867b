// Checkpoints: <dir>/step_NNNNNNNN/ holding the FP32 master weights (weights.safetensors), the
// AdamW moments (optimizer.safetensors) and state.json (checkpoint/state.h, with a SHA-256 per
// file). A checkpoint is written under a temporary name, fsynced and renamed, so it is visible
// only when complete; then <dir>/latest names it. A crash mid-save leaves the previous
// checkpoints as they were. A checkpoint directory belongs to one run: <dir>/.ptrain-owner holds
// the real path of the run directory that writes there.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "checkpoint/state.h"
#include "dist/communicator.h"
#include "model/transformer.h"
#include "optim/adamw.h"

namespace ptrain {

// ZeRO-1: one rank's AdamW moments ("m", "v") for elements [begin, begin + count) of the flat
// parameter vector.
struct MomentShard {
  int64_t begin = 0, count = 0;
  SafetensorsFile file;
};

struct LoadedCheckpoint {
  std::string path;
  CheckpointState state;
  SafetensorsFile weights;                   // the FP32 master weights, whole
  std::optional<SafetensorsFile> optimizer;  // the moments per tensor, or else:
  std::vector<MomentShard> shards;           // the moments in ZeRO-1 shards, in order
};

// The most bytes of a state.json load_checkpoint reads; save_checkpoint never writes more.
constexpr int64_t kMaxStateBytes = 64 << 20;
// An upper bound of the size of a state.json holding `fp8_tensors` amax histories of `history`
// values each and a guard window of `guard_window` losses (pretty-printed: a value a line, at
// most 48 bytes with its indent; the rest of the state within 64 KiB).
inline int64_t state_bytes_bound(int64_t fp8_tensors, int64_t history, int64_t guard_window) {
  return (int64_t{64} << 10) + 48 * guard_window + fp8_tensors * (256 + 48 * history);
}
// The longest history whose bound stays within kMaxStateBytes (0: not even one value).
inline int64_t longest_history_within(int64_t fp8_tensors, int64_t guard_window) {
  const int64_t room = kMaxStateBytes - state_bytes_bound(0, 0, guard_window);
  const int64_t per_tensor = fp8_tensors > 0 ? room / fp8_tensors : room;
  return per_tensor > 256 ? (per_tensor - 256) / 48 : 0;
}

// Writes the checkpoint of `step` under `dir`, updates `latest`, and removes all but the newest
// `keep_last` checkpoints. Returns its path. Throws EnvironmentError on I/O failure, naming the
// file; the earlier checkpoints and `latest` are then untouched. With a communicator every rank
// calls it: rank 0 writes the weights (gathered from the ZeRO-1 shards if need be) and
// state.json, each rank writes its optimizer shard under ZeRO-1, and the checkpoint is renamed
// into place only after every rank's part is on disk; if any rank fails, every rank throws.
// `before_publish` (rank 0) runs once the checkpoint is complete on disk, just before it is renamed
// into place: the point of no return for what a run changes only once it has a checkpoint.
std::string save_checkpoint(const std::string& dir, const CheckpointState& state, Transformer& model, AdamW& optimizer,
                            int keep_last, Communicator* comm = nullptr,
                            const std::function<void()>& before_publish = {});

// Loads and verifies one checkpoint: `path` is its directory (or a `latest` file naming it).
// Checked: state.json (checkpoint/state.h), every file's SHA-256 as recorded, every tensor of
// the shape state.json's model gives, every value finite. Throws UserError naming the
// checkpoint and what is wrong.
LoadedCheckpoint load_checkpoint(const std::string& path);

// The newest valid checkpoint under `dir` of a step before `before_step`: invalid ones (corrupt,
// incomplete) are reported through `warn` and skipped. nullopt when there is none. A checkpoint
// of a newer format is not skipped: NewerCheckpointFormat ends the search.
std::optional<LoadedCheckpoint> find_latest_checkpoint(const std::string& dir,
                                                       const std::function<void(const std::string&)>& warn,
                                                       int64_t before_step = INT64_MAX);

// The checkpoints under `dir` of steps after `step` (-1: all of them), and renaming checkpoints to
// <name>.superseded (.superseded.2, ... if taken), so that a run resumed from an earlier
// checkpoint never later resumes from the abandoned branch, nor overwrites it. Returns the new names.
// All or none: when one rename fails, those made are undone before the error goes on.
std::vector<std::string> checkpoints_after(const std::string& dir, int64_t step);
std::vector<std::string> set_aside_checkpoints(const std::vector<std::string>& checkpoints);
// A checkpoint's directory name under `dir` (step_NNNNNNNN), and pointing `latest` at it.
std::string checkpoint_name(int64_t step);
void point_latest_at(const std::string& dir, int64_t step);

// The file naming the run that owns an explicit checkpoint.dir.
constexpr const char* kCheckpointOwnerFile = ".ptrain-owner";
// Whether `dir` holds anything a save or a resume would touch (step_* directories, `latest`).
bool holds_checkpoints(const std::string& dir);
// The run directory recorded as `dir`'s owner, if any.
std::optional<std::string> checkpoint_dir_owner(const std::string& dir);
// Records `run_dir` (its real path) as `dir`'s owner.
void claim_checkpoint_dir(const std::string& dir, const std::string& run_dir);
// Removes the checkpoints, `latest` and leftovers of interrupted saves from `dir` (the
// checkpoints of a run that run.overwrite replaces), keeping the directory and its owner.
void remove_checkpoints(const std::string& dir);

// Copies checkpoint weights into the model's master weights (through Transformer::load_weights,
// so a sharded rank keeps its range) and refreshes its GEMM copy. Not while a step's gradients
// are in the model: a sharded master stages the weights in the gradient buffers.
void load_weights(const SafetensorsFile& weights, Transformer& model);

// Copies a loaded checkpoint's tensors into the model (master weights, then the low-precision
// copy) and the optimizer (this rank's shard of the moments, from whichever layout was saved).
// The model config must match (checked by the caller).
void restore_tensors(const LoadedCheckpoint& checkpoint, Transformer& model, AdamW& optimizer);

}  // namespace ptrain
