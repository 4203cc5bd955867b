// JSON that comes from disk (state.json, safetensors headers, synthetic.json, a run's metrics):
// parsed with its nesting bounded first. nlohmann's parser does not recurse, but copying or
// printing a value does, so a file nested a hundred thousand levels deep would overflow the
// stack later. An object with a key twice is refused too (which value counts would depend on the
// parser). Throws UserError naming `what`; a parse error shows no bytes of the text.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace ptrain {

constexpr int kMaxJsonDepth = 64;

nlohmann::json parse_json(const std::string& text, const std::string& what);

}  // namespace ptrain
