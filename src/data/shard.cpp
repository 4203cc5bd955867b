#include "data/shard.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <utility>

#include "core/error.h"

namespace ptrain {

// Shards are mapped and read in place, and headers written from native int32s, so the host
// must share the format's byte order.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "llm.c shards are little-endian");

namespace {

constexpr size_t kHeaderBytes = kShardHeaderInts * sizeof(int32_t);

std::string quoted(const std::string& s) { return "\"" + s + "\""; }

std::string errno_text() { return std::strerror(errno); }

// Writes all of `bytes`, retrying short writes; false (errno set) on failure.
bool write_all(int fd, const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = ::write(fd, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return true;
}

// Writes header + tokens to `tmp` and fsyncs it, so the rename that follows publishes a
// complete file or nothing.
void write_synced(const std::string& tmp, const std::vector<uint16_t>& tokens) {
  int32_t header[kShardHeaderInts] = {kShardMagic, kShardVersion, static_cast<int32_t>(tokens.size())};
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw UserError("cannot create shard " + quoted(tmp) + ": " + errno_text());
  bool ok = write_all(fd, header, kHeaderBytes) &&
            write_all(fd, tokens.data(), tokens.size() * sizeof(uint16_t)) && ::fsync(fd) == 0;
  std::string error = ok ? "" : errno_text();
  if (::close(fd) != 0 && ok) {
    ok = false;
    error = errno_text();
  }
  if (!ok) {
    ::unlink(tmp.c_str());
    throw UserError("cannot write shard " + quoted(tmp) + ": " + error);
  }
}

// The token count from a mapped shard's header, after checking the header against the file.
int64_t validated_count(const std::string& path, const void* map, size_t bytes) {
  const int32_t* header = static_cast<const int32_t*>(map);
  const std::string name = "shard " + quoted(path);
  if (header[0] != kShardMagic)
    throw UserError(name + " has magic " + std::to_string(header[0]) + ", expected " +
                    std::to_string(kShardMagic) + " (an llm.c token shard)");
  if (header[1] != kShardVersion)
    throw UserError(name + " has version " + std::to_string(header[1]) + ", expected " +
                    std::to_string(kShardVersion) + " (uint16 tokens)");
  const int64_t count = header[2];
  const int64_t expected = static_cast<int64_t>(kHeaderBytes) + 2 * count;
  if (count < 0 || static_cast<int64_t>(bytes) != expected)
    throw UserError(name + " is " + std::to_string(bytes) + " bytes but its header says " +
                    std::to_string(count) + " tokens, expected 1024 + 2 * " + std::to_string(count) +
                    " = " + std::to_string(expected) + " bytes (truncated or corrupt file?)");
  return count;
}

}  // namespace

void write_shard(const std::string& path, const std::vector<uint16_t>& tokens) {
  if (tokens.size() > static_cast<size_t>(INT32_MAX))
    throw UserError("shard " + quoted(path) + " would hold " + std::to_string(tokens.size()) +
                    " tokens, expected at most 2147483647 (the header's int32 count)");
  const std::string tmp = path + ".tmp";
  write_synced(tmp, tokens);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    std::string error = errno_text();
    ::unlink(tmp.c_str());
    throw UserError("cannot rename " + quoted(tmp) + " to " + quoted(path) + ": " + error);
  }
}

TokenShard::TokenShard(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw UserError("cannot open shard " + quoted(path) + ": " + errno_text());
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw UserError("shard " + quoted(path) + " is not a regular file, expected an llm.c token shard");
  }
  const size_t bytes = static_cast<size_t>(st.st_size);
  if (bytes < kHeaderBytes) {
    ::close(fd);
    throw UserError("shard " + quoted(path) + " is " + std::to_string(bytes) +
                    " bytes, expected at least the 1024-byte header of an llm.c token shard");
  }
  void* map = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  const std::string error = map == MAP_FAILED ? errno_text() : "";
  ::close(fd);  // the mapping stays valid without the descriptor
  if (map == MAP_FAILED) throw UserError("cannot map shard " + quoted(path) + ": " + error);
  try {
    count_ = validated_count(path, map, bytes);
  } catch (...) {
    ::munmap(map, bytes);
    throw;
  }
  map_ = map;
  map_bytes_ = bytes;
  tokens_ = reinterpret_cast<const uint16_t*>(static_cast<const char*>(map) + kHeaderBytes);
}

TokenShard::~TokenShard() {
  if (map_) ::munmap(map_, map_bytes_);
}

TokenShard::TokenShard(TokenShard&& other) noexcept
    : path_(std::move(other.path_)),
      map_(other.map_),
      map_bytes_(other.map_bytes_),
      tokens_(other.tokens_),
      count_(other.count_) {
  other.map_ = nullptr;
  other.map_bytes_ = 0;
  other.tokens_ = nullptr;
  other.count_ = 0;
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
  if (ec) throw UserError("cannot create directory \"" + dir + "\": " + ec.message());
}

std::string number_text(double x) {
  std::ostringstream out;
  out << x;
  return out.str();
}

}  // namespace ptrain
