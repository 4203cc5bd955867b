#include "data/shard.h"

#include <glob.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>
#include <utility>

#include "core/error.h"
#include "core/output_file.h"

namespace ptrain {

// Shards are read and written as native int32s and uint16s, so the host must share the
// format's byte order.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "llm.c shards are little-endian");

namespace {

constexpr size_t kHeaderBytes = kShardHeaderInts * sizeof(int32_t);

std::string quoted(const std::string& s) { return "\"" + s + "\""; }

std::string errno_text() { return std::strerror(errno); }

}  // namespace

int64_t shard_token_count(const int32_t (&header)[kShardHeaderInts], int64_t file_bytes, const std::string& name) {
  if (header[0] != kShardMagic)
    throw UserError(name + " does not begin with the magic number " + std::to_string(kShardMagic) +
                    "; expected an llm.c token shard");
  if (header[1] != kShardVersion)
    throw UserError(name + " has version " + std::to_string(header[1]) + ", expected " + std::to_string(kShardVersion) +
                    " (uint16 tokens)");
  const int64_t count = header[2];
  const int64_t expected = static_cast<int64_t>(kHeaderBytes) + 2 * count;
  if (count < 0 || file_bytes != expected)
    throw UserError(name + " is " + std::to_string(file_bytes) + " bytes but its header says " + std::to_string(count) +
                    " tokens, expected 1024 + 2 * " + std::to_string(count) + " = " + std::to_string(expected) +
                    " bytes (truncated or corrupt file?)");
  return count;
}

void write_shard(const std::string& path, const std::vector<uint16_t>& tokens) {
  if (tokens.size() > static_cast<size_t>(INT32_MAX))
    throw UserError("shard " + quoted(path) + " would hold " + std::to_string(tokens.size()) +
                    " tokens, expected at most 2147483647 (the header's int32 count)");
  int32_t header[kShardHeaderInts] = {kShardMagic, kShardVersion, static_cast<int32_t>(tokens.size())};
  AtomicFile out(path);
  out.write(header, kHeaderBytes);
  out.write(tokens.data(), tokens.size() * sizeof(uint16_t));
  out.commit();
}

TokenShard::TokenShard(const std::string& path) : file_(path, "shard " + quoted(path)) {
  if (file_.size() < static_cast<int64_t>(kHeaderBytes))
    throw UserError("shard " + quoted(path) + " is " + std::to_string(file_.size()) +
                    " bytes, expected at least the 1024-byte header of an llm.c token shard");
  int32_t header[kShardHeaderInts];
  file_.read_at(0, header, kHeaderBytes);
  count_ = shard_token_count(header, file_.size(), "shard " + quoted(path));
}

void TokenShard::read(int64_t pos, int64_t n, uint16_t* out) const {
  PTRAIN_CHECK(pos >= 0 && n >= 0 && pos + n <= count_, "token range outside the shard");
  file_.read_at(static_cast<int64_t>(kHeaderBytes) + 2 * pos, out, static_cast<size_t>(n) * sizeof(uint16_t));
}

std::vector<std::string> expand_shard_glob(const std::string& pattern, const std::string& key) {
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> paths(g.gl_pathv, g.gl_pathv + (rc == 0 ? g.gl_pathc : 0));
  ::globfree(&g);
  if (rc == GLOB_NOMATCH)
    throw UserError(key + ": no files match " + quoted(pattern) +
                    ", expected a glob matching llm.c token shards (e.g. \"data/x/train_*.bin\")");
  if (rc != 0) throw UserError(key + ": cannot expand " + quoted(pattern) + " (glob failed)");
  std::sort(paths.begin(), paths.end());
  for (const std::string& p : paths)
    if (::access(p.c_str(), R_OK) != 0)
      throw UserError(key + ": " + quoted(p) + " (matched by " + quoted(pattern) +
                      ") is not readable: " + errno_text());
  return paths;
}

void make_shard_dir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw EnvironmentError("cannot create directory \"" + dir + "\": " + ec.message());
}

}  // namespace ptrain
