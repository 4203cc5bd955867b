// The safetensors format (huggingface/safetensors): an 8-byte little-endian header length, a
// JSON header mapping each tensor name to {dtype, shape, data_offsets} plus optional string
// "__metadata__", then the tensors' bytes, contiguous and without holes. Checkpoints hold F32
// tensors; Hugging Face exports also BF16 or F16 (checkpoint/hf_directory.h).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace ptrain {

// The element types ptrain reads and writes, by their safetensors names.
enum class StDtype { f32, bf16, f16 };
const char* st_dtype_name(StDtype d);
size_t st_dtype_bytes(StDtype d);

struct SafetensorView {
  std::string name;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // shape's product of elements of `dtype`, little-endian
  StDtype dtype = StDtype::f32;
};

// Writes `tensors` (in order) and `metadata` to `path`, then fsyncs it; returns the SHA-256 of
// the bytes written. Throws EnvironmentError on any I/O failure, naming the file.
std::string write_safetensors(const std::string& path, const std::vector<SafetensorView>& tensors,
                              const std::map<std::string, std::string>& metadata);

// A safetensors file held in memory and validated: header JSON, dtypes (F32 only unless
// `any_float`: then BF16 and F16 too, converted exactly to float when copied), shapes whose sizes
// neither overflow nor disagree with their offsets, offsets that tile the byte buffer without
// holes. Throws UserError naming the file (`what`) and what was wrong.
class SafetensorsFile {
 public:
  // Reads `path` (a regular file; see core/input_file.h).
  static SafetensorsFile read(const std::string& path, bool any_float = false);
  // Reads `path` and checks its SHA-256 against `expected` before parsing a byte of it (a
  // mismatch is reported as such, not as whatever the damage did to the header).
  static SafetensorsFile read_checked(const std::string& path, const std::string& expected);
  SafetensorsFile(std::string bytes, std::string what, bool any_float = false);
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool has(const std::string& name) const { return entries_.count(name) > 0; }
  const std::vector<int64_t>& shape(const std::string& name) const;
  StDtype dtype(const std::string& name) const;
  // Copies tensor `name` into dst (count floats); throws UserError if absent or of another size.
  void copy_to(const std::string& name, float* dst, int64_t count) const;
  std::vector<std::string> names() const;
  // The name of the first tensor holding a NaN or infinity, or "" (with the index in `at`).
  std::string first_non_finite(int64_t* at) const;
  const std::string& sha256() const { return sha256_; }  // of the whole file

 private:
  SafetensorsFile(std::string bytes, std::string what, std::string sha256, bool any_float);
  struct Entry {
    std::vector<int64_t> shape;
    StDtype dtype;
    size_t begin, end;  // byte offsets into bytes_, after the header
  };
  std::string what_;
  std::string bytes_;  // the whole file
  size_t data_start_ = 0;
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
  std::string sha256_;
};

}  // namespace ptrain
