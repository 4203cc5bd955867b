#include "train/output_policy.h"

#include "checkpoint/checkpoint.h"
#include "core/error.h"
#include "core/paths.h"
#include "data/tokenizer_record.h"
#include "train/run_plan.h"

namespace fs = std::filesystem;

namespace ptrain {

namespace {

std::string quoted(const std::string& s) { return "\"" + s + "\""; }

bool exists_here(const fs::path& dir, const char* name) {
  std::error_code ec;
  return fs::symlink_status(dir / name, ec).type() != fs::file_type::not_found && !ec;
}

// The path made absolute and resolved as far as it exists, without a trailing "/" or "/.".
fs::path resolved(const std::string& path) {
  std::error_code ec;
  fs::path p = fs::weakly_canonical(fs::absolute(path), ec);
  if (ec) p = fs::absolute(path).lexically_normal();
  while (p.filename().empty() && p.has_parent_path() && p != p.parent_path()) p = p.parent_path();
  return p;
}

bool is_empty_directory(const fs::path& dir) {
  std::error_code ec;
  return fs::is_empty(dir, ec) && !ec;
}

}  // namespace

std::optional<std::string> owned_directory_kind(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return std::nullopt;
  if (exists_here(dir, "state.json")) return "the checkpoint";
  if (exists_here(dir, kRunMarker)) return "the run directory";
  if (exists_here(dir, kCheckpointOwnerFile) || holds_checkpoints(dir.string())) return "the checkpoint directory";
  if (exists_here(dir, kTokenizerRecord) || exists_here(dir, "synthetic.json")) return "the data directory";
  return std::nullopt;
}

std::vector<OwnedDirectory> enclosing_owned_directories(const fs::path& path, bool from_parent) {
  std::vector<OwnedDirectory> found;
  fs::path p = resolved(path.string());
  if (from_parent) p = p.parent_path();
  for (;; p = p.parent_path()) {
    if (auto kind = owned_directory_kind(p)) found.push_back({p, *kind});
    if (p == p.parent_path() || p.empty()) return found;
  }
}

void check_outside_owned_directories(const std::string& path, const std::string& flag) {
  const std::vector<OwnedDirectory> owners = enclosing_owned_directories(path, true);
  if (!owners.empty())
    throw UserError(flag + " " + quoted(path) + " is inside " + owners[0].kind + " " + quoted(owners[0].dir.string()) +
                    ", which ptrain manages; expected a path outside ptrain's checkpoint, run and data directories");
}

bool plan_output(const std::string& path, const OutputRule& rule) {
  const std::string shown = rule.flag + " " + quoted(path);
  const char* expected_kind = rule.directory ? "directory" : "file";
  if (path.empty()) throw UserError(rule.flag + ": an empty path; expected the " + expected_kind + " to write");
  std::error_code ec;
  if (fs::symlink_status(path, ec).type() == fs::file_type::symlink)
    throw UserError(shown + " is a symbolic link; expected a path that is not a link (ptrain does not write through "
                    "links, which could point into a checkpoint or another user's file)");
  const fs::path target = resolved(path);
  if (target == target.parent_path())
    throw UserError(shown + " is the filesystem's root; expected a " + std::string(expected_kind) + " to create");
  check_outside_owned_directories(path, rule.flag);
  const PathKind kind = path_kind(path, rule.flag);
  if (kind == PathKind::other)
    throw UserError(shown + " is not a regular file or a directory (a device or FIFO); expected the "
                    "path of a " + std::string(expected_kind) + " to write");
  if (kind == PathKind::directory && !rule.directory)
    throw UserError(shown + " is a directory; expected the path of a file to write");
  if (kind == PathKind::file && rule.directory)
    throw UserError(shown + " exists and is not a directory; expected the path of a directory to write");
  bool replacing = kind != PathKind::missing && !(rule.directory && is_empty_directory(target));
  if (replacing) {
    const std::string what_is_there = rule.directory ? "exists and is not empty" : "exists";
    if (!rule.force)
      throw UserError(shown + " " + what_is_there + "; expected a new " + expected_kind + ", or --force to replace an " +
                      "earlier output of " + rule.made_by);
    if (!rule.made_here || !rule.made_here(target))
      throw UserError(shown + " is not an earlier output of " + rule.made_by + "; --force replaces only those, " +
                      "expected a new " + expected_kind);
  }
  if (rule.directory) {
    check_creatable(target.string(), rule.flag, rule.inner_bytes);
  } else {
    const fs::path parent = target.parent_path();
    if (path_kind(parent.string(), rule.flag) != PathKind::directory)
      throw UserError(shown + ": the directory " + quoted(parent.string()) + " does not exist; expected the file's " +
                      "directory to exist");
    check_creatable(parent.string(), rule.flag, target.filename().string().size() + rule.inner_bytes);
  }
  return kind != PathKind::missing;
}

}  // namespace ptrain
