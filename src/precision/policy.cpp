#include "precision/policy.h"

#include "core/error.h"

namespace ptrain {

PrecisionPolicy PrecisionPolicy::from_mode(const std::string& mode) {
  if (mode != "fp32")
    throw UserError("precision.mode: " + mode + " is not supported by this build yet; expected fp32");
  return PrecisionPolicy{};
}

}  // namespace ptrain
