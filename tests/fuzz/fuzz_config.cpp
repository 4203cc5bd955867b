// The YAML run config: parsing, the schema, every validation rule, and the resolved YAML, which
// must parse back to the same config (config.yaml is written from it and read on resume).
#include <string>

#include "config/config.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  ptrain::Config config;
  if (!ptrain::fuzz::accepted([&] { config = ptrain::parse_config(text, "fuzz.yaml"); })) return 0;
  const std::string resolved = ptrain::config_to_yaml(config);
  if (ptrain::config_to_yaml(ptrain::parse_config(resolved, "resolved.yaml")) != resolved)
    throw std::logic_error("the resolved config does not read back as itself");
  return 0;
}
