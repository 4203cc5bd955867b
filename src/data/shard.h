// llm.c token shards: a 256 x int32 header (magic, version, token count), then the tokens.
// Two formats, as llm.c's dev/data/data_common.py writes them: GPT-2's (magic 20240520,
// version 1, uint16 tokens) and Llama 3's (magic 20240801, version 7, uint32 tokens), for
// vocabularies past 65,536. Shards made for llm.c train unchanged, and ours train in llm.c.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/input_file.h"

namespace ptrain {

constexpr int kShardHeaderInts = 256;

struct ShardFormat {
  int32_t magic, version;
  int token_bytes;    // 2 (uint16) or 4 (uint32)
  const char* name;   // for messages
};
// One object each across the program (inline), so a format is known by its address.
inline constexpr ShardFormat kUint16Shards{20240520, 1, 2, "llm.c's GPT-2 format, uint16 tokens"};
inline constexpr ShardFormat kUint32Shards{20240801, 7, 4, "llm.c's Llama 3 format, uint32 tokens"};

// The format for a vocabulary's ids: uint16 where every id fits, so that llm.c's GPT-2
// trainer reads the shards, else uint32.
const ShardFormat& shard_format_for(int64_t vocab_size);

// Creates `dir` and its parents for shards about to be written. Throws EnvironmentError on failure.
void make_shard_dir(const std::string& dir);

// Writes a shard atomically (temporary file, fsync, rename): uint16 tokens in the GPT-2
// format, uint32 tokens in the Llama 3 format. Throws EnvironmentError on I/O failure, naming
// the file.
void write_shard(const std::string& path, const uint16_t* tokens, size_t count);
void write_shard(const std::string& path, const uint32_t* tokens, size_t count);
inline void write_shard(const std::string& path, const std::vector<uint16_t>& tokens) {
  write_shard(path, tokens.data(), tokens.size());
}
inline void write_shard(const std::string& path, const std::vector<uint32_t>& tokens) {
  write_shard(path, tokens.data(), tokens.size());
}

// The header of `format` for `count` tokens.
void fill_shard_header(int32_t (&header)[kShardHeaderInts], const ShardFormat& format, int64_t count);

struct ShardHeader {
  const ShardFormat* format;
  int64_t count;
};
// What a shard header says, after checking it against the file's size (a known magic and
// version, size equal to header + count * token bytes). `name` names the shard in errors.
ShardHeader read_shard_header(const int32_t (&header)[kShardHeaderInts], int64_t file_bytes, const std::string& name);

// A read-only shard, validated on open (shard_token_count). Tokens are read on demand with
// positional reads (core/input_file.h): no mapping, so a shard truncated under a running job
// gives an error naming it, not SIGBUS. Throws UserError naming the file and what was expected.
class TokenShard {
 public:
  explicit TokenShard(const std::string& path);
  const std::string& path() const { return file_.path(); }
  int64_t size() const { return header_.count; }
  const ShardFormat& format() const { return *header_.format; }
  // Tokens [pos, pos + n) of this shard.
  void read(int64_t pos, int64_t n, uint32_t* out) const;

 private:
  InputFile file_;
  ShardHeader header_{};
};

// The sorted files matching a glob pattern. Throws UserError naming `key` (the config key the
// pattern came from) when nothing matches or a match is unreadable.
std::vector<std::string> expand_shard_glob(const std::string& pattern, const std::string& key);

}  // namespace ptrain
