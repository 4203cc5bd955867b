// JSON that comes from disk (state.json, safetensors headers, synthetic.json, a run's metrics):
// parsed with its nesting bounded first. nlohmann's parser does not recurse, but copying or
// printing a value does, so a file nested a hundred thousand levels deep would overflow the
// stack later. Throws UserError naming `what`.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace ptrain {

constexpr int kMaxJsonDepth = 64;

nlohmann::json parse_json(const std::string& text, const std::string& what);

}  // namespace ptrain
