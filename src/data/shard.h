// llm.c token shards: a 256 x int32 header (magic 20240520, version 1, token count), then the
// tokens as uint16. Shards made for llm.c train unchanged, and ours train in llm.c.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ptrain {

constexpr int32_t kShardMagic = 20240520;
constexpr int32_t kShardVersion = 1;
constexpr int kShardHeaderInts = 256;

// Creates `dir` and its parents for shards about to be written. Throws UserError on failure.
void make_shard_dir(const std::string& dir);

// A number as a person would write it in a message ("0.1", not std::to_string's "0.100000").
std::string number_text(double x);

// Writes a shard atomically (temporary file, fsync, rename). Throws UserError on I/O failure.
void write_shard(const std::string& path, const std::vector<uint16_t>& tokens);

// A read-only, memory-mapped shard, validated on open: magic, version, and file size equal to
// header + count * 2 bytes. Throws UserError naming the file and what was expected.
class TokenShard {
 public:
  explicit TokenShard(const std::string& path);
  ~TokenShard();
  TokenShard(TokenShard&& other) noexcept;
  TokenShard(const TokenShard&) = delete;
  TokenShard& operator=(const TokenShard&) = delete;
  TokenShard& operator=(TokenShard&&) = delete;

  const std::string& path() const { return path_; }
  int64_t size() const { return count_; }
  const uint16_t* tokens() const { return tokens_; }

 private:
  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const uint16_t* tokens_ = nullptr;
  int64_t count_ = 0;
};

// The sorted files matching a glob pattern. Throws UserError naming `key` (the config key the
// pattern came from) when nothing matches or a match is unreadable.
std::vector<std::string> expand_shard_glob(const std::string& pattern, const std::string& key);

}  // namespace ptrain
