// A checkpoint's state.json: JSON, then every field's type and range. A state that is accepted
// must survive being written and read again unchanged.
#include <nlohmann/json.hpp>

#include "checkpoint/state.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;  // not JSON: the loader reports that itself
  ptrain::CheckpointState state;
  if (!ptrain::fuzz::accepted([&] { state = ptrain::state_from_json(j); })) return 0;
  const nlohmann::json written = ptrain::state_to_json(state);
  if (ptrain::state_to_json(ptrain::state_from_json(written)) != written)
    throw std::logic_error("an accepted state does not read back as itself");
  return 0;
}
