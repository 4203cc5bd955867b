// Training runs in the test's own process: the run plan of a config file, the faults the test
// puts into it (train/step_faults.h), carried out by run_planned (what `ptrain train` does after
// planning) on the backend run.device gives, and the run's own log as the output. Paths are as the binary would see them from `dir` (the working
// directory while the run lasts), so messages name the same relative paths.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "dist/communicator.h"
#include "optim/divergence_guard.h"
#include "test_util.h"
#include "train/trainer.h"

namespace ptrain::test {

struct InProcessRun {
  int exit_code = 0;   // what `ptrain train` would exit with: 0, 1 (the machine), 2 (bad input), 4 (the guard)
  std::string output;  // the lines this run added to its log.txt, then the error's message if it failed
  TrainResult result;
};

// The working directory for a scope.
struct WorkingDirectory {
  std::filesystem::path before = std::filesystem::current_path();
  explicit WorkingDirectory(const std::filesystem::path& dir) { std::filesystem::current_path(dir); }
  ~WorkingDirectory() {
    std::error_code ec;
    std::filesystem::current_path(before, ec);
  }
};

// `ptrain train CONFIG --set SETS...` (with --stop-at `stop_at` when > 0) run here, with
// `faults` in PTRAIN_TEST_FAULT's form put into the plan.
inline InProcessRun train_in_process(const std::filesystem::path& dir, const std::string& config_file,
                                     const std::vector<std::string>& sets = {}, const std::string& faults = "",
                                     int64_t stop_at = 0) {
  const WorkingDirectory here(dir);
  InProcessRun run;
  std::filesystem::path log_file;
  std::uintmax_t logged_before = 0;
  try {
    RunPlan plan = plan_run(load_config(config_file, sets));
    plan.faults = StepFaults::parse(faults);
    log_file = std::filesystem::path(plan.run_dir) / "log.txt";
    std::error_code ec;
    if (std::filesystem::exists(log_file)) logged_before = std::filesystem::file_size(log_file, ec);
    TrainerDevices devices;
    devices.backend = make_backend(plan.config.run.device, plan.threads, plan.config.precision.tf32, 0,
                                   &devices.device_choice);
    devices.attention = choose_attention(plan, *devices.backend);
    devices.comm = make_communicator(devices.backend->device());
    TrainOptions options;
    options.stop_at = stop_at;
    run.result = run_planned(plan, std::move(devices), options);
  } catch (const DivergedError& e) {
    run.exit_code = 4;
    run.output = e.what();
  } catch (const UserError& e) {
    run.exit_code = 2;
    run.output = e.what();
  } catch (const EnvironmentError& e) {
    run.exit_code = 1;
    run.output = e.what();
  }
  if (!log_file.empty() && std::filesystem::exists(log_file)) {
    const std::string log = read_file(log_file);  // a replaced run directory's log starts afresh
    run.output = log.substr(log.size() >= logged_before ? static_cast<size_t>(logged_before) : 0) + run.output;
  }
  return run;
}

}  // namespace ptrain::test
