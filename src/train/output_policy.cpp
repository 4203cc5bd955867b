#include "train/output_policy.h"

#include <algorithm>

#include "checkpoint/checkpoint.h"
#include "core/error.h"
#include "core/input_file.h"
#include "core/paths.h"
#include "data/tokenizer_record.h"
#include "train/run_plan.h"

namespace fs = std::filesystem;

namespace ptrain {

namespace {

std::string quoted(const std::string& s) { return "\"" + s + "\""; }

constexpr const char* kStateMark = "\"ptrain checkpoint 1\"";

bool exists_here(const fs::path& dir, const char* name) {
  std::error_code ec;
  return fs::symlink_status(dir / name, ec).type() != fs::file_type::not_found && !ec;
}

// Whether dir/name is a regular file (not a link) whose first bytes hold `mark`: the files with
// common names (state.json, latest, synthetic.json) count as ptrain's only when ptrain wrote them.
bool file_marked(const fs::path& dir, const char* name, const std::string& mark) {
  std::error_code ec;
  if (fs::symlink_status(dir / name, ec).type() != fs::file_type::regular) return false;
  try {
    const InputFile in((dir / name).string(), name);
    std::string head(static_cast<size_t>(std::min<int64_t>(in.size(), 4096)), '\0');
    in.read_at(0, head.data(), head.size());
    return head.find(mark) != std::string::npos;
  } catch (const UserError&) {
    return false;
  }
}

// step_NNNNNNNN directories, or a `latest` naming one: what saves and keep_last touch.
bool holds_step_checkpoints(const fs::path& dir) {
  if (file_marked(dir, "latest", "step_")) return true;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() == 13 && name.rfind("step_", 0) == 0 &&
        name.find_first_not_of("0123456789", 5) == std::string::npos && file_marked(it->path(), "state.json", kStateMark))
      return true;
  }
  return false;
}

// Absolute, without a trailing "/" or "/.".
fs::path without_trailing(fs::path p) {
  while ((p.filename().empty() || p.filename() == ".") && p.has_parent_path() && p != p.parent_path())
    p = p.parent_path();
  return p;
}

// The path made absolute and resolved as the system resolves it (links, and ".." after them).
fs::path resolved(const std::string& path) {
  std::error_code ec;
  fs::path p = fs::weakly_canonical(fs::absolute(path), ec);
  if (ec) p = fs::absolute(path).lexically_normal();
  return without_trailing(p);
}

void refuse_empty(const std::string& path, const std::string& flag, const char* kind) {
  if (path.empty()) throw UserError(flag + ": an empty path; expected the " + kind + " to write");
}

}  // namespace

std::string output_landing(const std::string& path) {
  const fs::path real = resolved(path);
  return real == without_trailing(fs::absolute(path).lexically_normal()) ? path : real.string();
}

std::optional<std::string> owned_directory_kind(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return std::nullopt;
  if (file_marked(dir, "state.json", kStateMark)) return "the checkpoint";
  if (exists_here(dir, kRunMarker)) return "the run directory";
  if (exists_here(dir, kCheckpointOwnerFile) || holds_step_checkpoints(dir)) return "the checkpoint directory";
  if (exists_here(dir, kTokenizerRecord) || file_marked(dir, "synthetic.json", "\"source\": \"ptrain "))
    return "the data directory";
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

static void check_outside_owned_directories(const std::string& path, const std::string& flag) {
  const std::vector<OwnedDirectory> owners = enclosing_owned_directories(path, true);
  if (!owners.empty())
    throw UserError(flag + " " + quoted(path) + " is inside " + owners[0].kind + " " + quoted(owners[0].dir.string()) +
                    ", which ptrain manages; expected a path outside ptrain's checkpoint, run and data directories");
}

std::string plan_outside_owned_directories(const std::string& path, const std::string& flag) {
  refuse_empty(path, flag, "directory");
  const std::string landing = output_landing(path);  // where the checks look is where it writes
  check_outside_owned_directories(landing, flag);
  return landing;
}

std::string plan_output(const std::string& path, const OutputRule& rule) {
  const std::string shown = rule.flag + " " + quoted(path);
  const char* expected_kind = rule.directory ? "directory" : "file";
  refuse_empty(path, rule.flag, expected_kind);
  // The last name as given, without the "/" or "/." that would make the system follow a link.
  const fs::path last = without_trailing(path);
  std::error_code ec;
  if (fs::symlink_status(last, ec).type() == fs::file_type::symlink)
    throw UserError(shown + " is a symbolic link; expected a path that is not a link (ptrain does not write through "
                    "links, which could point into a checkpoint or another user's file)");
  const fs::path target = resolved(path);
  if (target == target.parent_path())
    throw UserError(shown + " is the filesystem's root; expected a " + std::string(expected_kind) + " to create");
  // Everything below is of the resolved path, which the command then writes: "new/../x" or
  // "link/.." name the same place to the checks and to the writer.
  check_outside_owned_directories(target.string(), rule.flag);
  const PathKind kind = path_kind(target.string(), rule.flag);
  if (kind == PathKind::other)
    throw UserError(shown + " is not a regular file or a directory (a device or FIFO); expected the "
                    "path of a " + std::string(expected_kind) + " to write");
  if (kind == PathKind::directory && !rule.directory)
    throw UserError(shown + " is a directory; expected the path of a file to write");
  if (kind == PathKind::file && rule.directory)
    throw UserError(shown + " exists and is not a directory; expected the path of a directory to write");
  bool replacing = kind != PathKind::missing && !(rule.directory && is_empty_directory(target.string()));
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
  return output_landing(path);
}

}  // namespace ptrain
