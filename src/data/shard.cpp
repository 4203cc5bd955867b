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

// Shards are read and written as native int32s, uint16s and uint32s, so the host must share the
// format's byte order.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "llm.c shards are little-endian");

namespace {

constexpr size_t kHeaderBytes = kShardHeaderInts * sizeof(int32_t);

std::string quoted(const std::string& s) { return "\"" + s + "\""; }

std::string errno_text() { return std::strerror(errno); }

}  // namespace

const ShardFormat& shard_format_for(int64_t vocab_size) {
  return vocab_size <= 65536 ? kUint16Shards : kUint32Shards;
}

void fill_shard_header(int32_t (&header)[kShardHeaderInts], const ShardFormat& format, int64_t count) {
  PTRAIN_CHECK(count >= 0 && count <= INT32_MAX, "shard token count outside the header's int32");
  std::fill(std::begin(header), std::end(header), 0);
  header[0] = format.magic;
  header[1] = format.version;
  header[2] = static_cast<int32_t>(count);
}

ShardHeader read_shard_header(const int32_t (&header)[kShardHeaderInts], int64_t file_bytes, const std::string& name) {
  const std::string known = std::to_string(kUint16Shards.magic) + " (" + kUint16Shards.name + ") or " +
                            std::to_string(kUint32Shards.magic) + " (" + kUint32Shards.name + ")";
  const ShardFormat* format = nullptr;
  for (const ShardFormat* f : {&kUint16Shards, &kUint32Shards})
    if (header[0] == f->magic) format = f;
  if (format == nullptr)
    throw UserError(name + " begins with " + std::to_string(header[0]) + ", expected the magic number " + known +
                    " of an llm.c token shard");
  // The version is what says the token width: a magic with another version would be read at
  // the wrong width.
  if (header[1] != format->version)
    throw UserError(name + " has magic " + std::to_string(format->magic) + " and version " +
                    std::to_string(header[1]) + ", expected version " + std::to_string(format->version) + " (" +
                    format->name + ")");
  const int64_t count = header[2];
  const int64_t expected = static_cast<int64_t>(kHeaderBytes) + format->token_bytes * count;
  if (count < 0 || file_bytes != expected)
    throw UserError(name + " is " + std::to_string(file_bytes) + " bytes but its header says " + std::to_string(count) +
                    " tokens, expected 1024 + " + std::to_string(format->token_bytes) + " * " + std::to_string(count) +
                    " = " + std::to_string(expected) + " bytes (" + format->name + "; truncated or corrupt file?)");
  return {format, count};
}

namespace {

template <typename Token>
void write_tokens(const std::string& path, const Token* tokens, size_t count, const ShardFormat& format) {
  static_assert(sizeof(Token) == 2 || sizeof(Token) == 4, "tokens are uint16 or uint32");
  if (count > static_cast<size_t>(INT32_MAX))
    throw UserError("shard " + quoted(path) + " would hold " + std::to_string(count) +
                    " tokens, expected at most 2147483647 (the header's int32 count)");
  int32_t header[kShardHeaderInts];
  fill_shard_header(header, format, static_cast<int64_t>(count));
  AtomicFile out(path);
  out.write(header, kHeaderBytes);
  out.write(tokens, count * sizeof(Token));
  out.commit();
}

}  // namespace

void write_shard(const std::string& path, const uint16_t* tokens, size_t count) {
  write_tokens(path, tokens, count, kUint16Shards);
}

void write_shard(const std::string& path, const uint32_t* tokens, size_t count) {
  write_tokens(path, tokens, count, kUint32Shards);
}

TokenShard::TokenShard(const std::string& path) : file_(path, "shard " + quoted(path)) {
  if (file_.size() < static_cast<int64_t>(kHeaderBytes))
    throw UserError("shard " + quoted(path) + " is " + std::to_string(file_.size()) +
                    " bytes, expected at least the 1024-byte header of an llm.c token shard");
  int32_t header[kShardHeaderInts];
  file_.read_at(0, header, kHeaderBytes);
  header_ = read_shard_header(header, file_.size(), "shard " + quoted(path));
}

void TokenShard::read(int64_t pos, int64_t n, uint32_t* out) const {
  PTRAIN_CHECK(pos >= 0 && n >= 0 && pos + n <= header_.count, "token range outside the shard");
  const int width = header_.format->token_bytes;
  const int64_t at = static_cast<int64_t>(kHeaderBytes) + width * pos;
  if (width == 4) {
    file_.read_at(at, out, static_cast<size_t>(n) * sizeof(uint32_t));
    return;
  }
  // uint16 ids widen in place, back to front: the read fills the buffer's first half, and id i
  // lies below where out[i] goes. Bytes are copied through memcpy, which aliases any type.
  auto* bytes = reinterpret_cast<unsigned char*>(out);
  file_.read_at(at, bytes, static_cast<size_t>(n) * sizeof(uint16_t));
  for (int64_t i = n - 1; i >= 0; --i) {
    uint16_t id;
    std::memcpy(&id, bytes + 2 * i, sizeof(id));
    out[i] = id;
  }
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
