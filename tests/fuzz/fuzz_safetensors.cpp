// safetensors files: the header, offsets and shapes, and every tensor copied out, F32 only and
// with BF16/F16 converted.
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // As a checkpoint reads it (F32 only), and as an HF import does (BF16 and F16 too).
  for (const bool any_float : {false, true}) {
    ptrain::fuzz::accepted([&] {
      const ptrain::SafetensorsFile file(std::string(reinterpret_cast<const char*>(data), size), "fuzz.safetensors",
                                         any_float);
      for (const std::string& name : file.names()) {
        int64_t count = 1;
        for (const int64_t d : file.shape(name)) count *= d;
        std::vector<float> values(static_cast<size_t>(count));
        file.copy_to(name, values.data(), count);
      }
      int64_t at = 0;
      file.first_non_finite(&at);
    });
  }
  return 0;
}
