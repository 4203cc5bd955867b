// A scratch directory with token shards and a tiny run config, for tests that drive the real
// binary with bad input and check that it ends cleanly: the exit code, the message naming the
// culprit, and nothing written (a snapshot of every file, compared before and after).
#pragma once

#include <catch2/catch.hpp>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "data/shard.h"
#include "test_util.h"

namespace ptrain::test {

struct BadInputWorkspace {
  TempDir temp{"bad-input"};
  const std::filesystem::path& dir = temp.dir;

  BadInputWorkspace() {
    std::filesystem::create_directories(dir / "data");
    std::vector<uint16_t> tokens(6000);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>((i * 7 + i / 13) % 64);
    write_shard((dir / "data/train_000000.bin").string(), tokens);
    write_shard((dir / "data/val_000000.bin").string(), tokens);
    write_file(dir / "run.yaml", config());
  }

  static std::string config(const std::string& extra = "") {
    return "run: {name: r, out_dir: runs}\n"
           "model: {n_layer: 1, n_head: 2, n_embd: 16, seq_len: 16, vocab_size: 64}\n"
           "data: {train: \"data/train_*.bin\", val: \"data/val_*.bin\"}\n"
           "training: {steps: 3, batch_tokens: 64, micro_batch: 4, eval_batches: 2, eval_every: 0}\n" +
           extra;
  }
  CommandResult ptrain(const std::string& args, const std::string& env = "") const { return run_ptrain(args, dir, env); }
  CommandResult train(const std::string& flags = "", const std::string& env = "") const {
    return ptrain("train run.yaml " + flags, env);
  }
  std::filesystem::path run(const std::string& name = "r") const { return dir / "runs" / name; }

  // Every file below the workspace with its bytes (links by their target, others by kind).
  std::map<std::string, std::string> snapshot() const {
    std::map<std::string, std::string> files;
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
      const std::string rel = e.path().lexically_relative(dir).string();
      std::error_code ec;
      files[rel] = e.is_symlink(ec)        ? "<link to " + std::filesystem::read_symlink(e.path(), ec).string() + ">"
                   : e.is_regular_file(ec) ? read_file(e.path())
                                           : std::string("<not a regular file>");
    }
    return files;
  }
};

// The command failed with `code`, naming each fragment, and left the workspace as it was.
inline void expect_refused(const BadInputWorkspace& ws, const std::map<std::string, std::string>& before,
                           const CommandResult& r, int code, std::initializer_list<std::string> fragments) {
  INFO(r.output);
  CHECK(r.exit_code == code);
  for (const std::string& f : fragments) CHECK(r.output.find(f) != std::string::npos);
  CHECK(r.output.find("internal error") == std::string::npos);
  const auto after = ws.snapshot();
  CHECK(after.size() == before.size());
  for (const auto& [name, bytes] : before) {
    INFO("file " << name);
    CHECK(after.count(name) == 1);
    if (after.count(name)) CHECK(after.at(name) == bytes);
  }
  for (const auto& [name, bytes] : after) {
    INFO("new file " << name);
    CHECK(before.count(name) == 1);
  }
}

}  // namespace ptrain::test
