// The safetensors format (huggingface/safetensors): an 8-byte little-endian header length, a
// JSON header mapping each tensor name to {dtype, shape, data_offsets} plus optional string
// "__metadata__", then the tensors' bytes, contiguous and without holes. ptrain writes F32
// tensors; other tools load the files unchanged.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace ptrain {

struct SafetensorView {
  std::string name;
  std::vector<int64_t> shape;
  const float* data = nullptr;  // shape's product of floats
};

// Writes `tensors` (in order) and `metadata` to `path`, then fsyncs it. Throws UserError on any
// I/O failure (a full disk, a read-only directory), naming the file.
void write_safetensors(const std::string& path, const std::vector<SafetensorView>& tensors,
                       const std::map<std::string, std::string>& metadata);

// A safetensors file read fully into memory and validated: header JSON, F32 dtypes, offsets
// inside the buffer that cover it without holes, sizes matching shapes. Throws UserError
// naming the file and what was wrong.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool has(const std::string& name) const { return entries_.count(name) > 0; }
  const std::vector<int64_t>& shape(const std::string& name) const;
  // Copies tensor `name` into dst (count floats); throws UserError if absent or of another size.
  void copy_to(const std::string& name, float* dst, int64_t count) const;
  std::vector<std::string> names() const;

 private:
  struct Entry {
    std::vector<int64_t> shape;
    size_t begin, end;
  };
  std::string path_;
  std::vector<char> data_;  // the byte buffer after the header
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace ptrain
