#include "checkpoint/safetensors.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/sha256.h"
#include "core/error.h"
#include "core/input_file.h"
#include "core/tensor.h"
#include "core/json_input.h"
#include "core/output_file.h"
#include "precision/formats.h"

namespace ptrain {

const char* st_dtype_name(StDtype d) {
  switch (d) {
    case StDtype::bf16: return "BF16";
    case StDtype::f16: return "F16";
    default: return "F32";
  }
}

size_t st_dtype_bytes(StDtype d) { return d == StDtype::f32 ? 4 : 2; }

namespace {

// The element count of a shape, or -1 when a dimension is negative or the product would not fit
// in the bytes a file can hold (a crafted header must not wrap around to a small size).
int64_t checked_count(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return -1;
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / 4 / d) return -1;
    n *= d;
  }
  return n;
}

}  // namespace

std::string write_safetensors(const std::string& path, const std::vector<SafetensorView>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header;
  if (!metadata.empty()) header["__metadata__"] = metadata;
  size_t offset = 0;
  for (const auto& t : tensors) {
    const size_t bytes = static_cast<size_t>(shape_numel(t.shape)) * st_dtype_bytes(t.dtype);
    header[t.name] = {{"dtype", st_dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // keep the tensor data 8-byte aligned
  const uint64_t length = text.size();
  uint8_t length_le[8];
  for (int i = 0; i < 8; ++i) length_le[i] = static_cast<uint8_t>(length >> (8 * i));

  Sha256 hash;
  OutputFile out(path);
  const auto put = [&](const void* data, size_t bytes) {
    out.write(data, bytes);
    hash.update(data, bytes);
  };
  put(length_le, sizeof length_le);
  put(text.data(), text.size());
  for (const auto& t : tensors) put(t.data, static_cast<size_t>(shape_numel(t.shape)) * st_dtype_bytes(t.dtype));
  out.finish(true);
  return hash.hex_digest();
}

SafetensorsFile SafetensorsFile::read(const std::string& path, bool any_float) {
  const std::string what = "\"" + path + "\"";
  return SafetensorsFile(InputFile(path, what).read_all(std::numeric_limits<int64_t>::max()), what, any_float);
}

SafetensorsFile SafetensorsFile::read_checked(const std::string& path, const std::string& expected) {
  const std::string what = "\"" + path + "\"";
  std::string bytes = InputFile(path, what).read_all(std::numeric_limits<int64_t>::max());
  std::string sha = sha256_hex(bytes.data(), bytes.size());
  if (sha != expected)
    throw UserError(what + " does not match its SHA-256 in state.json (truncated or corrupted)");
  return SafetensorsFile(std::move(bytes), what, std::move(sha), false);
}

SafetensorsFile::SafetensorsFile(std::string bytes, std::string what, bool any_float)
    : SafetensorsFile(bytes, std::move(what), sha256_hex(bytes.data(), bytes.size()), any_float) {}

SafetensorsFile::SafetensorsFile(std::string bytes, std::string what, std::string sha256, bool any_float)
    : what_(std::move(what)), bytes_(std::move(bytes)), sha256_(std::move(sha256)) {
  auto bad = [&](const std::string& why) { return UserError(what_ + " is not a valid safetensors file: " + why); };
  const size_t size = bytes_.size();
  if (size < 8) throw bad("shorter than its 8-byte header length");
  uint64_t length = 0;
  for (int i = 0; i < 8; ++i) length |= uint64_t{static_cast<uint8_t>(bytes_[i])} << (8 * i);
  if (length > size - 8) throw bad("its first 8 bytes give no header length within its " + std::to_string(size) + " bytes");
  data_start_ = 8 + static_cast<size_t>(length);
  const size_t data_bytes = size - data_start_;

  const nlohmann::json header = parse_json(bytes_.substr(8, static_cast<size_t>(length)), what_ + "'s header");
  if (!header.is_object()) throw bad("header is not a JSON object");
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) throw bad("__metadata__ is not an object");
      for (const auto& [k, v] : entry.items())
        if (v.is_string()) metadata_[k] = v.get<std::string>();
      continue;
    }
    try {
      if (!entry.is_object()) throw bad("entry " + name + " is not an object");
      const auto& dtype = entry.at("dtype");
      StDtype type = StDtype::f32;
      if (any_float && dtype == "BF16") type = StDtype::bf16;
      else if (any_float && dtype == "F16") type = StDtype::f16;
      else if (dtype != "F32") throw bad("tensor " + name + " is not F32" + (any_float ? ", BF16 or F16" : ""));
      const auto& offsets = entry.at("data_offsets");
      if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
          !offsets[1].is_number_unsigned())
        throw bad("tensor " + name + " has data_offsets that are not two byte offsets");
      const auto& shape = entry.at("shape");
      if (!shape.is_array() || !std::all_of(shape.begin(), shape.end(), [](const auto& d) { return d.is_number_integer(); }))
        throw bad("tensor " + name + " has a shape that is not a list of integers");
      Entry e{shape.get<std::vector<int64_t>>(), type, offsets[0].get<size_t>(), offsets[1].get<size_t>()};
      const int64_t count = checked_count(e.shape);
      if (count < 0) throw bad("tensor " + name + " has a shape with a negative or overflowing size");
      if (e.begin > e.end || e.end > data_bytes || e.end - e.begin != static_cast<size_t>(count) * st_dtype_bytes(type))
        throw bad("tensor " + name + " has offsets that do not match its shape or the file");
      entries_[name] = std::move(e);
    } catch (const nlohmann::json::exception& ex) {
      throw bad("entry " + name + " is malformed (" + ex.what() + ")");
    }
  }
  // The spec: tensors tile the byte buffer exactly, no holes and no overlaps.
  std::vector<std::pair<size_t, size_t>> spans;
  for (const auto& [name, e] : entries_) spans.emplace_back(e.begin, e.end);
  std::sort(spans.begin(), spans.end());
  size_t at = 0;
  for (const auto& [begin, end] : spans) {
    if (begin != at) throw bad("tensor data has a hole or an overlap at byte " + std::to_string(at));
    at = end;
  }
  if (at != data_bytes) throw bad("tensor data does not cover the byte buffer exactly");
}

const std::vector<int64_t>& SafetensorsFile::shape(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) throw UserError(what_ + " has no tensor " + name);
  return it->second.shape;
}

StDtype SafetensorsFile::dtype(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) throw UserError(what_ + " has no tensor " + name);
  return it->second.dtype;
}

void SafetensorsFile::copy_to(const std::string& name, float* dst, int64_t count) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) throw UserError(what_ + " has no tensor " + name);
  const Entry& e = it->second;
  if (shape_numel(e.shape) != count)
    throw UserError(what_ + ": tensor " + name + " holds " + std::to_string(shape_numel(e.shape)) + " values; expected " +
                    std::to_string(count));
  const char* src = bytes_.data() + data_start_ + e.begin;
  if (e.dtype == StDtype::f32) return void(std::memcpy(dst, src, e.end - e.begin));
  for (int64_t i = 0; i < count; ++i) {
    uint16_t bits;
    std::memcpy(&bits, src + 2 * i, 2);
    dst[i] = e.dtype == StDtype::bf16 ? bf16_value(bits) : fp16_value(bits);
  }
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  for (const auto& [name, e] : entries_) out.push_back(name);
  return out;
}

std::string SafetensorsFile::first_non_finite(int64_t* at) const {
  for (const auto& [name, e] : entries_) {
    const int64_t count = shape_numel(e.shape);
    std::vector<float> values(static_cast<size_t>(count));
    copy_to(name, values.data(), count);
    for (int64_t i = 0; i < count; ++i) {
      if (!std::isfinite(values[i])) {
        if (at) *at = static_cast<int64_t>(i);
        return name;
      }
    }
  }
  return "";
}

}  // namespace ptrain
