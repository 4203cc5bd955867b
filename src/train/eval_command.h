// `ptrain eval`: a checkpoint's validation loss, in FP32 and with --weights int8.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "config/config.h"
#include "train/checkpoint_model.h"

namespace ptrain {

// The val loss of a checkpoint's weights on the config's validation batches, computed in FP32:
// with its masters, and with int8 weights also with those; `oracle` for synthetic data. Throws
// UserError for a checkpoint of another model shape or missing val data.
struct CheckpointLosses {
  int64_t step = 0;
  int batches = 0;
  double fp32 = 0;
  std::optional<double> int8, oracle;
};
CheckpointLosses checkpoint_val_losses(const Config& config, const std::string& checkpoint, WeightFormat weights);

// `ptrain eval CONFIG --checkpoint DIR`: the val loss of the checkpoint's weights on the
// config's validation batches, and the gap to the oracle loss for synthetic data. With int8
// weights, the loss with the masters first, then with INT8 weights and the difference. With
// `dump_logits`, also writes that file (JSON: the first validation window's tokens and the FP32
// logits over the real vocabulary at each of its positions), for comparing with another
// implementation of the model (scripts/hf_logits.py). The file follows train/output_policy.h:
// `force` replaces only an earlier dump.
void eval_checkpoint(const Config& config, const std::string& checkpoint, const std::string& dump_logits = "",
                     WeightFormat weights = WeightFormat::fp32, bool force = false);

}  // namespace ptrain
