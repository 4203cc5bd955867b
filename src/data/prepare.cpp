#include "data/prepare.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "core/error.h"
#include "core/input_file.h"
#include "core/paths.h"
#include "data/shard.h"

namespace ptrain {

namespace fs = std::filesystem;

namespace {

// A file's bytes: a regular file only (core/input_file.h refuses FIFOs, devices, directories).
std::vector<uint8_t> read_input(const std::string& path) {
  const InputFile in(path, "input \"" + path + "\"");
  std::vector<uint8_t> bytes(static_cast<size_t>(in.size()));
  in.read_at(0, bytes.data(), bytes.size());
  return bytes;
}

std::vector<uint8_t> read_inputs(const std::vector<std::string>& inputs) {
  std::vector<uint8_t> all;
  for (const std::string& path : inputs) {
    std::vector<uint8_t> bytes = read_input(path);
    all.insert(all.end(), bytes.begin(), bytes.end());
  }
  return all;
}

// Writes bytes [begin, end) as <dir>/<split>_NNNNNN.bin shards of at most shard_tokens tokens.
void write_split(const std::vector<uint8_t>& bytes, int64_t begin, int64_t end, const fs::path& dir,
                 const std::string& split, int64_t shard_tokens, std::vector<std::string>& files) {
  for (int64_t index = 0, pos = begin; pos < end; ++index, pos += shard_tokens) {
    const int64_t stop = std::min(end, pos + shard_tokens);
    char name[64];
    std::snprintf(name, sizeof(name), "%s_%06lld.bin", split.c_str(), static_cast<long long>(index));
    files.push_back((dir / name).string());
    write_shard(files.back(), std::vector<uint16_t>(bytes.begin() + pos, bytes.begin() + stop));
  }
}

}  // namespace

PrepareResult prepare_bytes(const std::vector<std::string>& inputs, const std::string& out_dir,
                            double val_fraction, int64_t shard_tokens) {
  if (!(val_fraction > 0 && val_fraction < 1))
    throw UserError("val_fraction is " + number_text(val_fraction) +
                    ", expected a fraction strictly between 0 and 1");
  if (shard_tokens < 1 || shard_tokens > INT32_MAX)
    throw UserError("shard_tokens is " + std::to_string(shard_tokens) +
                    ", expected 1..2147483647 (the shard header's int32 count)");
  check_creatable(out_dir, "--out", 32);
  const std::vector<uint8_t> bytes = read_inputs(inputs);
  const auto total = static_cast<int64_t>(bytes.size());
  PrepareResult result;
  result.val_tokens = std::max<int64_t>(1, std::llround(val_fraction * static_cast<double>(total)));
  result.train_tokens = total - result.val_tokens;
  // A split needs an input token and a target token for even one training window.
  if (result.train_tokens < 2 || result.val_tokens < 2)
    throw UserError("the inputs hold " + std::to_string(total) + " bytes, which with val_fraction " +
                    number_text(val_fraction) + " gives " + std::to_string(result.train_tokens) +
                    " train and " + std::to_string(result.val_tokens) +
                    " val tokens; expected at least 2 in each split (more text, or another val_fraction)");
  make_shard_dir(out_dir);
  write_split(bytes, 0, result.train_tokens, out_dir, "train", shard_tokens, result.files);
  write_split(bytes, result.train_tokens, total, out_dir, "val", shard_tokens, result.files);
  return result;
}

}  // namespace ptrain
