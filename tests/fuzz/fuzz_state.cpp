// A checkpoint's state.json: JSON (its nesting bounded), then every field's type and range. A
// state that is accepted must survive being written and read again unchanged.
#include <nlohmann/json.hpp>

#include "checkpoint/state.h"
#include "core/json_input.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ptrain::CheckpointState state;
  const auto parse = [&] {
    state = ptrain::state_from_json(ptrain::parse_json(std::string(reinterpret_cast<const char*>(data), size), "state.json"));
  };
  if (!ptrain::fuzz::accepted(parse)) return 0;
  const nlohmann::json written = ptrain::state_to_json(state);
  if (ptrain::state_to_json(ptrain::state_from_json(written)) != written)
    throw std::logic_error("an accepted state does not read back as itself");
  return 0;
}
