// llm.c token shards: a 256 x int32 header (magic 20240520, version 1, token count), then the
// tokens as uint16. Shards made for llm.c train unchanged, and ours train in llm.c.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/input_file.h"

namespace ptrain {

constexpr int32_t kShardMagic = 20240520;
constexpr int32_t kShardVersion = 1;
constexpr int kShardHeaderInts = 256;

// Creates `dir` and its parents for shards about to be written. Throws EnvironmentError on failure.
void make_shard_dir(const std::string& dir);

// Writes a shard atomically (temporary file, fsync, rename). Throws EnvironmentError on I/O
// failure, naming the file.
void write_shard(const std::string& path, const std::vector<uint16_t>& tokens);

// The token count a shard header gives, after checking it against the file's size (magic,
// version, size equal to header + count * 2 bytes). `name` names the shard in errors.
int64_t shard_token_count(const int32_t (&header)[kShardHeaderInts], int64_t file_bytes, const std::string& name);

// A read-only shard, validated on open (shard_token_count). Tokens are read on demand with
// positional reads (core/input_file.h): no mapping, so a shard truncated under a running job
// gives an error naming it, not SIGBUS. Throws UserError naming the file and what was expected.
class TokenShard {
 public:
  explicit TokenShard(const std::string& path);
  const std::string& path() const { return file_.path(); }
  int64_t size() const { return count_; }
  // Tokens [pos, pos + n) of this shard.
  void read(int64_t pos, int64_t n, uint16_t* out) const;

 private:
  InputFile file_;
  int64_t count_ = 0;
};

// The sorted files matching a glob pattern. Throws UserError naming `key` (the config key the
// pattern came from) when nothing matches or a match is unreadable.
std::vector<std::string> expand_shard_glob(const std::string& pattern, const std::string& key);

}  // namespace ptrain
