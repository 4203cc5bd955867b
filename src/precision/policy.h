// Which dtype each class of tensor uses under a precision mode (DESIGN.md section 4). The
// model and trainer ask the policy instead of testing the mode string, so new modes change
// this object, not the training code. This build supports fp32 only.
#pragma once

#include <string>

#include "core/tensor.h"

namespace ptrain {

struct PrecisionPolicy {
  std::string mode = "fp32";
  DType master = DType::f32;      // master weights
  DType compute = DType::f32;     // weights, activations and gradients the ops see
  DType optimizer = DType::f32;   // AdamW moments

  // Throws UserError for a mode this build cannot train.
  static PrecisionPolicy from_mode(const std::string& mode);
  // Label for logs and MFU ("fp32" ...).
  const std::string& label() const { return mode; }
};

}  // namespace ptrain
