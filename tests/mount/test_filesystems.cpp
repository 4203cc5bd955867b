// Real filesystems that refuse writes: a tmpfs remounted read-only (caught while planning: exit
// 2, nothing deleted by run.overwrite), and a tmpfs that fills up during training (exit 1
// naming the file and "No space left on device"; the earlier checkpoints stay valid).
#include <catch2/catch.hpp>

#include "bad_input.h"
#include "tmpfs.h"

using namespace ptrain;
using namespace ptrain::test;
namespace fs = std::filesystem;

TEST_CASE("a read-only filesystem is refused while planning, before run.overwrite deletes anything", "[mount]") {
  BadInputWorkspace ws;
  Tmpfs disk(8 << 20);
  const std::string out = "--set run.out_dir=" + disk.dir().string();
  REQUIRE(ws.train(out).exit_code == 0);
  disk.remount_read_only();
  const auto before = ws.snapshot();
  std::map<std::string, std::string> on_disk;
  for (const auto& e : fs::recursive_directory_iterator(disk.dir()))
    if (e.is_regular_file()) on_disk[e.path().string()] = read_file(e.path());
  for (const std::string& flags : {out + " --set run.overwrite=true", out + " --set run.name=new",
                                   out + " --set run.overwrite=true --dry-run"}) {
    INFO(flags);
    expect_refused(ws, before, ws.train(flags), 2, {"read-only filesystem"});
  }
  for (const auto& [path, bytes] : on_disk) CHECK(read_file(path) == bytes);
}

TEST_CASE("a disk that fills during training stops the run with exit 1 and keeps the earlier checkpoints", "[mount]") {
  BadInputWorkspace ws;
  Tmpfs disk(400 << 10);  // a checkpoint of this model is about 70 KB: the fifth or so does not fit
  const CommandResult r = ws.train("--set run.out_dir=" + disk.dir().string() +
                                   " --set training.steps=50 --set checkpoint.every=1 --set checkpoint.keep_last=50");
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK(r.output.find("No space left on device") != std::string::npos);
  CHECK(r.output.find(disk.dir().string()) != std::string::npos);
  CHECK(r.output.find("internal error") == std::string::npos);
  const fs::path checkpoints = disk.dir() / "r/checkpoints";
  for (const auto& e : fs::directory_iterator(checkpoints)) CHECK(e.path().filename().string().find(".tmp") == std::string::npos);
  // `latest` names a checkpoint that verifies.
  const std::string latest = read_file(checkpoints / "latest");
  REQUIRE(latest.size() == 14);
  const CommandResult inspect = ws.ptrain("inspect " + (checkpoints / latest.substr(0, 13)).string());
  INFO(inspect.output);
  CHECK(inspect.exit_code == 0);
  CHECK(inspect.output.find("  valid") != std::string::npos);
}

TEST_CASE("a disk too full for the log stops the run with exit 1 naming the file", "[mount]") {
  BadInputWorkspace ws;
  Tmpfs disk(24 << 10);  // config.yaml and the first lines fit; the log and metrics soon do not
  const CommandResult r = ws.train("--set run.out_dir=" + disk.dir().string() +
                                   " --set training.steps=2000 --set checkpoint.save_final=false");
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK(r.output.find("cannot write") != std::string::npos);
  CHECK(r.output.find("No space left on device") != std::string::npos);
  CHECK((r.output.find("metrics.jsonl") != std::string::npos || r.output.find("log.txt") != std::string::npos));
}
