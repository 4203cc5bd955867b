// One rule for every path a command is told to write (export --out, eval --dump-logits, data
// synth --out, data prepare --out, data hf-tokenizer --out, compare --out), checked while
// planning, before any work:
//   - the path is new, or the same command's own earlier output and --force is given (an empty
//     directory counts as new);
//   - it is never a symbolic link (ptrain does not write through links), and never inside a
//     directory another command owns: a checkpoint, a run's checkpoint directory, a run
//     directory, a data directory (ptrain's tokenizer record or a synthetic corpus);
//   - a file's parent directory exists; a directory's missing parents can be created.
// A refusal is a UserError naming the flag, the path and what was expected.
#pragma once

#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace ptrain {

struct OutputRule {
  std::string flag;         // "--out", "--dump-logits"
  bool directory = false;   // a directory (else a file)
  std::string made_by;      // whose earlier output may be replaced, for messages: "ptrain export --format llmc"
  bool force = false;
  // Whether the existing path is that command's earlier output (a file: its header; a
  // directory: nothing in it that the command does not write).
  std::function<bool(const std::filesystem::path&)> made_here;
  size_t inner_bytes = 64;  // the longest name the command puts below or beside the path
};

// Refuses what the rule forbids; returns output_landing(path), which the command must write: the
// place the checks were made of.
std::string plan_output(const std::string& path, const OutputRule& rule);

// Where a write to `path` lands: `path` as given, unless links or ".." after a link or a missing
// directory make the system land elsewhere than the name says; then that place, resolved.
std::string output_landing(const std::string& path);

// The part of the rule that `data prepare --out` (new or empty, which src/data/prepare.h checks)
// shares: refuses an empty path and one inside a directory ptrain manages; returns
// output_landing(path), which the command must write.
std::string plan_outside_owned_directories(const std::string& path, const std::string& flag);

// Which ptrain directory `dir` is, in words ("the checkpoint", "the run directory", ...), or
// nothing when it is none of them.
std::optional<std::string> owned_directory_kind(const std::filesystem::path& dir);

// The directories at or above `path` (resolved, links followed) that ptrain owns, nearest first,
// with their kinds; `from_parent` starts the search at the parent.
struct OwnedDirectory {
  std::filesystem::path dir;
  std::string kind;
};
std::vector<OwnedDirectory> enclosing_owned_directories(const std::filesystem::path& path, bool from_parent);

}  // namespace ptrain
