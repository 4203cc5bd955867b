#include "checkpoint/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace ptrain {
namespace {

void write_all(int fd, const void* data, size_t bytes, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd, p, bytes);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw UserError("cannot write \"" + path + "\": " + std::strerror(errno));
    }
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

int64_t product(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<SafetensorView>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header;
  if (!metadata.empty()) header["__metadata__"] = metadata;
  size_t offset = 0;
  for (const auto& t : tensors) {
    const size_t bytes = static_cast<size_t>(product(t.shape)) * sizeof(float);
    header[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // keep the tensor data 8-byte aligned
  const uint64_t length = text.size();
  uint8_t length_le[8];
  for (int i = 0; i < 8; ++i) length_le[i] = static_cast<uint8_t>(length >> (8 * i));

  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw UserError("cannot create \"" + path + "\": " + std::strerror(errno));
  try {
    write_all(fd, length_le, sizeof length_le, path);
    write_all(fd, text.data(), text.size(), path);
    for (const auto& t : tensors) write_all(fd, t.data, static_cast<size_t>(product(t.shape)) * sizeof(float), path);
    if (::fsync(fd) != 0) throw UserError("cannot sync \"" + path + "\": " + std::strerror(errno));
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (::close(fd) != 0) throw UserError("cannot close \"" + path + "\": " + std::strerror(errno));
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw UserError("cannot read \"" + path + "\"");
  const auto size = static_cast<size_t>(in.tellg());
  in.seekg(0);
  auto bad = [&](const std::string& what) {
    return UserError("\"" + path + "\" is not a valid safetensors file: " + what);
  };
  uint8_t length_le[8];
  if (size < 8 || !in.read(reinterpret_cast<char*>(length_le), 8)) throw bad("shorter than its 8-byte header length");
  uint64_t length = 0;
  for (int i = 0; i < 8; ++i) length |= uint64_t{length_le[i]} << (8 * i);
  if (length > size - 8) throw bad("header length " + std::to_string(length) + " exceeds the file size");
  std::string text(length, '\0');
  in.read(text.data(), static_cast<std::streamsize>(length));
  data_.resize(size - 8 - length);
  in.read(data_.data(), static_cast<std::streamsize>(data_.size()));
  if (!in) throw bad("read failed");

  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw bad(std::string("header is not JSON (") + e.what() + ")");
  }
  if (!header.is_object()) throw bad("header is not a JSON object");
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      for (const auto& [k, v] : entry.items())
        if (v.is_string()) metadata_[k] = v.get<std::string>();
      continue;
    }
    try {
      if (entry.at("dtype").get<std::string>() != "F32") throw bad("tensor " + name + " is not F32");
      Entry e{entry.at("shape").get<std::vector<int64_t>>(), entry.at("data_offsets").at(0).get<size_t>(),
              entry.at("data_offsets").at(1).get<size_t>()};
      const bool negative = std::any_of(e.shape.begin(), e.shape.end(), [](int64_t d) { return d < 0; });
      if (negative || e.begin > e.end || e.end > data_.size() ||
          e.end - e.begin != static_cast<size_t>(product(e.shape)) * sizeof(float))
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
  if (at != data_.size()) throw bad("tensor data does not cover the byte buffer exactly");
}

const std::vector<int64_t>& SafetensorsFile::shape(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) throw UserError("\"" + path_ + "\" has no tensor " + name);
  return it->second.shape;
}

void SafetensorsFile::copy_to(const std::string& name, float* dst, int64_t count) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) throw UserError("\"" + path_ + "\" has no tensor " + name);
  const Entry& e = it->second;
  if (product(e.shape) != count)
    throw UserError("\"" + path_ + "\": tensor " + name + " holds " + std::to_string(product(e.shape)) +
                    " values; expected " + std::to_string(count));
  std::memcpy(dst, data_.data() + e.begin, e.end - e.begin);
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  for (const auto& [name, e] : entries_) out.push_back(name);
  return out;
}

}  // namespace ptrain
