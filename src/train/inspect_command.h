// `ptrain inspect`: what a checkpoint or model file holds.
#pragma once

#include <string>

namespace ptrain {

// `ptrain inspect PATH`: what a checkpoint directory, a safetensors file or an llm.c model file
// holds, and whether a checkpoint's checksums are valid.
void inspect(const std::string& path);

}  // namespace ptrain
