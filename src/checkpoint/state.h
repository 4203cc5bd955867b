// A checkpoint's state.json: everything a resumed run needs besides the tensors (step, data
// position, loss scaler, FP8 histories and scales, the model config). It comes from disk, so it
// is parsed as untrusted input: every field present, of its type and within its range, or an
// error naming the field. `format_version` lets later versions change the file and still read
// every earlier one (a file without it is version 1).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/config.h"
#include "core/error.h"
#include "optim/divergence_guard.h"
#include "precision/loss_scaler.h"

namespace ptrain {

constexpr int kStateFormatVersion = 1;

// A checkpoint written by a newer ptrain: not damaged, so never skipped as if it were.
class NewerCheckpointFormat : public UserError {
 public:
  using UserError::UserError;
};

struct Fp8ScalingState {
  std::string name;
  std::vector<float> history;
  float scale = 1;
};

struct CheckpointState {
  int64_t step = 0;             // optimizer steps completed (skipped ones included)
  int64_t tokens = 0;           // training tokens consumed
  int64_t optimizer_steps = 0;  // AdamW updates applied (for bias correction)
  LossScaler::State scaler{1.0, 0, 1, 0};
  LossScalingMode scaler_mode = LossScalingMode::off;  // restored only into a run with the same mode
  DivergenceGuard::State guard;     // empty in checkpoints from before the guard
  std::vector<Fp8ScalingState> fp8;
  double best_val_loss = 0;
  int64_t best_val_step = -1;  // -1: no evaluation yet
  uint64_t data_seed = 0;      // the training sampler: window i starts at hash(seed, i)
  int64_t next_sample = 0;     // the next training window's index
  std::string precision;       // the mode label at save time
  std::string tokenizer;       // a tokenizer's name (data/tokenizer.h), "" unknown (synthetic data, llm.c shards), so sample can decode
  std::string vocabulary_sha256;  // of the files the shards were made with ("" unknown, or bytes)
  nlohmann::json model;        // the model config section: resume refuses another shape
  nlohmann::json schedule;     // keys that shape the rest of the run: resume warns when they change
};

// The state as state.json holds it (without the files' checksums, which the saver adds).
nlohmann::json state_to_json(const CheckpointState& state);

// Parses and checks a state.json object. Throws UserError naming the field, what it holds and
// what was expected ("step: 9223372036854775808 is out of range; expected an integer in ...").
CheckpointState state_from_json(const nlohmann::json& j);

// The model keys a checkpoint records and a resume must agree on, and back; model_from_json
// checks each key as the config does (a positive n_head that divides n_embd, ...).
nlohmann::json model_json(const ModelConfig& model);
ModelConfig model_from_json(const nlohmann::json& model);

// The model-config keys whose values differ between two model sections ("model.n_embd 128 vs 256").
std::vector<std::string> model_differences(const nlohmann::json& saved, const nlohmann::json& current);

}  // namespace ptrain
