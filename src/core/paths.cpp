#include "core/paths.h"

#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include "core/error.h"

namespace fs = std::filesystem;

namespace ptrain {

std::string data_cache_dir() {
  const char* cache = std::getenv("PTRAIN_CACHE");
  if (cache && *cache) return cache;
  const char* home = std::getenv("HOME");
  return (fs::path(home && *home ? home : ".") / ".cache" / "ptrain").string();
}

namespace {

std::string in_quotes(const std::string& s) { return "\"" + s + "\""; }

std::string stat_error(int err) {
  switch (err) {
    case ELOOP: return "is a symbolic link loop (or too many links deep)";
    case ENAMETOOLONG: return "has a name too long for the filesystem";
    case ENOTDIR: return "has a path component that is not a directory";
    case EACCES: return "cannot be examined (permission denied)";
    default: return std::string("cannot be examined (") + std::strerror(err) + ")";
  }
}

UserError name_too_long(const std::string& what, const std::string& name, size_t limit) {
  return UserError(what + ": the name \"" + name.substr(0, 40) + "...\" is " + std::to_string(name.size()) +
                   " bytes; expected at most " + std::to_string(limit) + " (the filesystem's limit for one name)");
}

}  // namespace

bool is_empty_directory(const std::string& dir) {
  std::error_code ec;
  return fs::is_empty(dir, ec) && !ec;
}

PathKind path_kind(const std::string& path, const std::string& what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0)
    return S_ISDIR(st.st_mode) ? PathKind::directory : S_ISREG(st.st_mode) ? PathKind::file : PathKind::other;
  const int err = errno;
  if (err == ENOENT) {
    // A dangling symbolic link is "missing" to stat, but creating the path would fail.
    if (::lstat(path.c_str(), &st) == 0)
      throw UserError(what + ": " + in_quotes(path) + " is a symbolic link to a path that does not exist");
    return PathKind::missing;
  }
  throw UserError(what + ": " + in_quotes(path) + " " + stat_error(err));
}

namespace {

// Why nothing can be written into the directory `dir`, or "".
std::string unwritable_reason(const std::string& dir) {
  struct statvfs vfs {};
  if (::statvfs(dir.c_str(), &vfs) == 0 && (vfs.f_flag & ST_RDONLY)) return "it is on a read-only filesystem";
  // Permissions, quotas and pseudo-filesystems (/proc, /sys) are only truly answered by trying:
  // an empty directory made and removed at once. Root passes access(2) checks that writes fail.
  std::string probe = (fs::path(dir) / ".ptrain-probe-XXXXXX").string();
  if (::mkdtemp(probe.data()) == nullptr) return std::string("nothing can be created in it: ") + std::strerror(errno);
  ::rmdir(probe.c_str());
  return "";
}

}  // namespace

void check_writable_dir(const std::string& dir, const std::string& what) {
  const std::string why = unwritable_reason(dir);
  if (!why.empty())
    throw UserError(what + ": " + in_quotes(dir) + " is not writable (" + why + "); expected a directory ptrain may write into");
}

void check_creatable(const std::string& path, const std::string& what, size_t extra) {
  if (path.empty()) throw UserError(what + ": an empty path; expected a directory name");
  const fs::path target = fs::absolute(fs::path(path)).lexically_normal();
  if (target.string().size() + extra >= PATH_MAX)
    throw UserError(what + ": " + in_quotes(path) + " is " + std::to_string(target.string().size()) +
                    " characters long as an absolute path; expected under " + std::to_string(PATH_MAX - extra) +
                    " (the files ptrain writes below it must fit in PATH_MAX " + std::to_string(PATH_MAX) + ")");
  // No filesystem Linux mounts takes a longer name than NAME_MAX; stat would only say "too long".
  for (const fs::path& part : target)
    if (part.string().size() > NAME_MAX) throw name_too_long(what, part.string(), NAME_MAX);
  // Walk up to the nearest ancestor that exists; every component below it is new.
  std::vector<std::string> missing;
  fs::path ancestor = target;
  for (;;) {
    const PathKind kind = path_kind(ancestor.string(), what);
    if (kind == PathKind::directory) break;
    if (kind != PathKind::directory && kind != PathKind::missing && ancestor == target)
      throw UserError(what + ": " + in_quotes(path) + " exists and is not a directory; expected a directory there");
    if (kind != PathKind::directory && kind != PathKind::missing)
      throw UserError(what + ": " + in_quotes(ancestor.string()) + " is a file, so " + in_quotes(path) +
                      " cannot be created below it; expected a directory there");
    missing.push_back(ancestor.filename().string());
    if (!ancestor.has_parent_path() || ancestor.parent_path() == ancestor) break;
    ancestor = ancestor.parent_path();
  }
  const long name_max = ::pathconf(ancestor.c_str(), _PC_NAME_MAX);
  const size_t limit = name_max > 0 ? static_cast<size_t>(name_max) : NAME_MAX;
  for (const std::string& name : missing)
    if (name.size() > limit) throw name_too_long(what, name, limit);
  const std::string why = unwritable_reason(ancestor.string());
  if (why.empty()) return;
  if (missing.empty())
    throw UserError(what + ": " + in_quotes(path) + " is not writable (" + why + "); expected a directory ptrain may write into");
  throw UserError(what + ": " + in_quotes(path) + " cannot be created: " + in_quotes(ancestor.string()) + " is not writable (" +
                  why + "); expected a location ptrain may write into");
}

void check_link_stays_inside(const std::string& dir, const std::string& name, const std::string& what) {
  const fs::path file = fs::path(dir) / name;
  std::error_code ec;
  if (fs::symlink_status(file, ec).type() != fs::file_type::symlink) return;
  const fs::path real_dir = fs::weakly_canonical(dir, ec);
  const fs::path target = fs::weakly_canonical(file, ec);
  const auto within = [](const fs::path& p, const fs::path& root) {
    const fs::path rel = p.lexically_relative(root);
    return !rel.empty() && *rel.begin() != "..";
  };
  if (!ec && within(target, real_dir)) return;
  // Hugging Face's cache: models--ORG--NAME/blobs/HASH, linked from its snapshots or from a
  // directory huggingface_hub downloaded into with links.
  const fs::path blobs = target.parent_path();
  if (!ec && blobs.filename() == "blobs" && blobs.parent_path().filename().string().rfind("models--", 0) == 0) return;
  throw UserError(what + ": \"" + file.string() + "\" is a symbolic link to a file outside \"" + dir +
                  "\"; expected the file itself, or a link within the directory or into a Hugging Face cache's "
                  "models--*/blobs");
}

}  // namespace ptrain
