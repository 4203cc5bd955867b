// The GPU check's scripts and ptrain devices, on a machine without a GPU: what a borrowed GPU's
// first minutes depend on must be right before they start.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.h"

namespace ptrain::test {
namespace {

namespace fs = std::filesystem;

std::string gpu_check(const std::string& args, const std::string& env = "") {
  return "cd '" + source_dir().string() + "' && " + env + " ./scripts/gpu-check.sh " + args;
}

// `text` single-quoted for the shell.
std::string quoted(const std::string& text) {
  std::string q = "'";
  for (char c : text) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// `commands` run by bash in the source tree, scripts/gpu-check-lib.sh's functions defined.
CommandResult with_lib(const std::string& commands) {
  return run_shell("cd " + quoted(source_dir().string()) + " && bash -c " +
                   quoted(". scripts/gpu-check-lib.sh && " + commands));
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// Whether `summary` has the line gpu-check.sh's record() writes for `result` and `name`.
bool has_record(const std::string& summary, const std::string& result, const std::string& name) {
  const std::regex line(result + R"( +[0-9.]+s  )" + std::regex_replace(name, std::regex(R"([.^$|()\[\]{}*+?\\])"), R"(\$&)"));
  for (const std::string& l : lines_of(summary))
    if (std::regex_match(l, line)) return true;
  return false;
}

// One row of --plan's table of a stage: "  EXPECTEDs  LIMIT  STEP".
struct PlanStep {
  int expected;
  std::string limit;
  std::string name;
};

// The steps and the stated total of `stage`'s table in --plan's output.
std::vector<PlanStep> plan_steps(const std::string& output, const std::string& stage, int* total) {
  std::vector<PlanStep> steps;
  const std::regex row(R"( +([0-9]+)s +([0-9]+|-)  (.+))"), sum(R"( +total expected: ([0-9]+) s.*)");
  bool inside = false;
  std::smatch m;
  for (const std::string& line : lines_of(output)) {
    if (line.rfind(stage + " (", 0) == 0) inside = true;
    if (!inside) continue;
    if (std::regex_match(line, m, row)) steps.push_back({std::stoi(m[1]), m[2], m[3]});
    if (std::regex_match(line, m, sum)) {
      *total = std::stoi(m[1]);
      break;
    }
  }
  return steps;
}

TEST_CASE("gpu-check.sh --plan prints every stage's steps without a GPU or a bundle", "[gpu-scripts]") {
  const CommandResult r = run_shell(gpu_check("--plan"));
  INFO(r.output);
  CHECK(r.exit_code == 0);
  for (const char* expected :
       {"estimates, not measurements", "first (the default; budget 540 s)", "ptrain devices", "train fp8:block on cuda",
        "op and kernel tests in one process", "training tests in one process", "CUDA_LAUNCH_BLOCKING=1",
        "CUDNN_LOGLEVEL_DBG=2", "hf export vs transformers", "speed (budget 540 s)", "bench 124m fp8 recipe=block",
        "bench 774m bf16", "sanitize (budget 540 s)", "memcheck --nvtx yes", "racecheck: the op and kernel tests",
        "-w NoTests"}) {
    INFO("expected: " << expected);
    CHECK(r.output.find(expected) != std::string::npos);
  }
}

TEST_CASE("gpu-check.sh --plan: the first call fits 540 s, its training runs and tests before speed", "[gpu-scripts]") {
  const CommandResult r = run_shell(gpu_check("--plan first"));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  int total = -1;
  const std::vector<PlanStep> steps = plan_steps(r.output, "first", &total);
  REQUIRE(!steps.empty());
  int sum = 0;
  for (const PlanStep& s : steps) {
    INFO(s.name);
    CHECK(s.expected > 0);
    if (s.limit != "-") CHECK(std::stoi(s.limit) >= s.expected);  // a step can finish within its limit
    sum += s.expected;
  }
  CHECK(total == sum);
  CHECK(total <= 540);
  CHECK(r.output.find("total expected: " + std::to_string(total) + " s of the 540 s budget: fits") != std::string::npos);

  // By what each teaches: one training run per mode on cuda and on cpu, then the gpu tests
  // (op and kernel tests, then training tests), the Hugging Face export, then benchmark rows.
  auto at = [&](const std::string& prefix) {
    for (size_t i = 0; i < steps.size(); ++i)
      if (steps[i].name.rfind(prefix, 0) == 0) return static_cast<int>(i);
    return -1;
  };
  int last_run = -1;
  for (const char* mode : {"fp32", "bf16", "fp16", "fp8:delayed", "fp8:current", "fp8:block"})
    for (const char* device : {"cuda", "cpu"}) {
      const int i = at(std::string("train ") + mode + " on " + device);
      INFO(mode << " on " << device);
      CHECK(i >= 0);
      last_run = std::max(last_run, i);
    }
  const int ops = at("gpu tests: "), hf = at("hf export vs transformers"), bench = at("bench 124m bf16");
  CHECK(last_run < ops);
  CHECK(steps[ops].name.find("op and kernel tests in one process") != std::string::npos);
  CHECK(steps[ops + 1].name.find("training tests in one process") != std::string::npos);
  CHECK(ops + 1 < hf);
  CHECK(hf < bench);
  CHECK(at("bench ") == bench);
  CHECK(r.output.find("left for the speed stage: ") != std::string::npos);
}

TEST_CASE("gpu-check.sh --plan fails when the expected total is over the budget", "[gpu-scripts]") {
  const CommandResult r = run_shell(gpu_check("--plan first", "GPU_CHECK_BUDGET=300"));
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK(r.output.find("over the 300 s budget by ") != std::string::npos);
  CHECK(r.output.find("bench 124m") == std::string::npos);  // no benchmark row fits
}

TEST_CASE("gpu-check.sh --plan speed keeps only the rows its filter matches", "[gpu-scripts]") {
  const CommandResult r = run_shell(gpu_check("--plan speed '^124m fp8'"));
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("bench 124m fp8 recipe=current") != std::string::npos);
  CHECK(r.output.find("bench 124m fp8 recipe=delayed") != std::string::npos);
  CHECK(r.output.find("124m bf16") == std::string::npos);
  CHECK(r.output.find("350m") == std::string::npos);
  CHECK(r.output.find("first (") == std::string::npos);
}

TEST_CASE("gpu-check.sh refuses an unknown stage with its usage", "[gpu-scripts]") {
  const CommandResult r = run_shell(gpu_check("speedy"));
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("scripts/gpu-check.sh [first]") != std::string::npos);
}

TEST_CASE("gpu-check.sh without a bundle fails at once and leaves its summary in OUT", "[gpu-scripts]") {
  const fs::path dir = make_temp_dir("gpu-check");
  const CommandResult r =
      run_shell(gpu_check("", "OUT='" + dir.string() + "' PTRAIN_GPU_BUNDLE='" + (dir / "none.tar.xz").string() + "'"));
  INFO(r.output);
  CHECK(r.exit_code == 1);
  const std::string summary = read_file(dir / "first-summary.txt");
  CHECK(summary.find("FAIL") != std::string::npos);
  CHECK(summary.find("no bundle at") != std::string::npos);
  CHECK(fs::exists(dir / "first.log"));
  CHECK(fs::exists(dir / "first-details.tar.gz"));
  fs::remove_all(dir);
}

// Stand-ins for the bundle's binaries. ptrain: `devices` names STAND_IN_GPUS GPUs (1 unless
// set) and, with STAND_IN_NO_CUBLASLT set, a cuBLASLt it could not load; `train` writes 3
// losses where its config puts the run, `bench` prints nothing.
const char* kStandInPtrain = R"SH(#!/bin/sh
case "$1" in
  devices)
    if [ -n "${STAND_IN_NO_CUBLASLT:-}" ]; then
      echo "loaded: CUDA runtime 13.0, driver 13.0, cuBLASLt none (libcublasLt.so.13 could not be loaded), cuDNN 9.19.0"
    else
      echo "loaded: CUDA runtime 13.0"
    fi
    i=0
    while [ $i -lt "${STAND_IN_GPUS:-1}" ]; do echo "cuda:$i NVIDIA H200 (stand-in)"; i=$((i + 1)); done ;;
  train)
    dir=$(sed -n 's/^run: {name: \([^,]*\), out_dir: \([^,]*\),.*/\2\/\1/p' "$2")
    mkdir -p "$dir"
    for i in 1 2 3; do echo "{\"step\": $i, \"loss\": 5.$i}"; done >"$dir/metrics.jsonl" ;;
esac
)SH";
// ptrain_gpu_tests: in its group's process "op a" passes, "op b, with a comma" fails and "op c"
// crashes the process (before "op d"); alone, each prints its filter and "op b" fails again.
const char* kStandInGpuTests = R"SH(#!/bin/sh
if [ "$1" = --list-test-names-only ]; then
  [ "$2" = "[train]" ] && echo "gpu: train a" || printf '%s\n' "gpu: op a" "gpu: op b, with a comma" "gpu: op c" "gpu: op d"
  exit 0
fi
echo "Warning: CUDNN_STATUS_NOT_SUPPORTED; Reason: stand-in" >>"$CUDNN_LOGDEST_DBG"
for xml; do :; done
case "$1" in
  "[gpu]~[train]")
    printf '%s\n' '<TestCase name="gpu: op a" tags="[gpu]">' '<OverallResult success="true" durationInSeconds="1.5"/>' \
      '</TestCase>' '<TestCase name="gpu: op b, with a comma" tags="[gpu]">' \
      '<Expression success="false"><Original>x == y</Original></Expression>' \
      '<OverallResult success="false" durationInSeconds="0.5"/>' '</TestCase>' '<TestCase name="gpu: op c" tags="[gpu]">' >"$xml"
    kill -SEGV $$ ;;
  "[train]")
    printf '%s\n' '<TestCase name="gpu: train a" tags="[gpu][train]">' \
      '<OverallResult success="true" durationInSeconds="12.5"/>' '</TestCase>' >"$xml" ;;
  *)
    echo "filter: $1, CUDA_LAUNCH_BLOCKING=${CUDA_LAUNCH_BLOCKING:-unset}"
    case "$1" in *"op b"*) exit 1 ;; esac ;;
esac
)SH";

// dir/bundle.tar.xz: the stand-ins above, and with `with_mpi` a ptrain_multigpu_tests that
// passes and names the launcher it was given.
void write_stand_in_bundle(const fs::path& dir, bool with_mpi) {
  fs::create_directories(dir / "bundle/bin");
  write_file(dir / "bundle/bin/ptrain", kStandInPtrain);
  write_file(dir / "bundle/bin/ptrain_gpu_tests", kStandInGpuTests);
  if (with_mpi) write_file(dir / "bundle/bin/ptrain_multigpu_tests", "#!/bin/sh\necho \"launcher: $PTRAIN_MPIEXEC\"\n");
  write_file(dir / "bundle/MANIFEST", "ptrain GPU bundle\ncommit: stand-in\nbuilt: stand-in\n");
  REQUIRE(run_shell("cd '" + dir.string() + "' && chmod +x bundle/bin/* && tar -C bundle -cJf bundle.tar.xz .").exit_code ==
          0);
}

TEST_CASE("gpu-check.sh's first call records each gpu test, reruns failures alone and leaves its results in OUT",
          "[gpu-scripts]") {
  TempDir dir("gpu-check-run");
  write_stand_in_bundle(dir.dir, /*with_mpi=*/true);
  const fs::path out = dir.dir / "out";
  const CommandResult r =
      run_shell(gpu_check("", "OUT='" + out.string() + "' PTRAIN_GPU_BUNDLE='" + (dir.dir / "bundle.tar.xz").string() + "'"));
  INFO(r.output);
  CHECK(r.exit_code == 1);

  const std::string summary = read_file(out / "first-summary.txt");
  INFO(summary);
  // The device's facts first, then the steps in the plan's order.
  const size_t first_step = summary.find("\nPASS ");
  CHECK(summary.find("cuda:0 NVIDIA H200 (stand-in)") < first_step);
  CHECK(summary.find("libcudnn: not linked") < first_step);
  CHECK(summary.find("libcublasLt: loaded on first use, not linked") < first_step);  // never linked
  CHECK(summary.find("train fp8:block on cpu") < summary.find("gpu tests: "));
  // Each test of the group's process by its own line; the failing one again alone, blocking;
  // the one the process crashed in, again alone; the one after it, alone.
  CHECK(has_record(summary, "FAIL", "gpu tests: 4 op and kernel tests in one process (exit 139)"));
  CHECK(has_record(summary, "PASS", "gpu test: gpu: op a"));
  CHECK(has_record(summary, "FAIL", "gpu test: gpu: op b, with a comma"));
  CHECK(has_record(summary, "FAIL", "gpu test: gpu: op b, with a comma, again alone with CUDA_LAUNCH_BLOCKING=1 (exit 1)"));
  CHECK(has_record(summary, "FAIL", "gpu test: gpu: op c: the process ended in it (exit 139)"));
  CHECK(has_record(summary, "PASS", "gpu test: gpu: op c, again alone with CUDA_LAUNCH_BLOCKING=1"));
  CHECK(has_record(summary, "PASS", "gpu test: gpu: op d, alone, after the group's process ended"));
  CHECK(has_record(summary, "PASS", "gpu test: gpu: train a"));
  // One GPU: the multi-GPU step says so instead of running.
  CHECK(has_record(summary, "SKIP", "ZeRO-0 to ZeRO-3 across GPUs: 1 GPU on this machine, the step needs 2"));

  const std::string failures = read_file(out / "first-failures.log");
  INFO(failures);
  CHECK(failures.find("== gpu test: gpu: op b, with a comma: its record in the group's XML report") != std::string::npos);
  CHECK(failures.find("<Original>x == y</Original>") != std::string::npos);
  CHECK(failures.find("filter: gpu: op b\\, with a comma, CUDA_LAUNCH_BLOCKING=1") != std::string::npos);
  CHECK(failures.find("Warning: CUDNN_STATUS_NOT_SUPPORTED; Reason: stand-in") != std::string::npos);

  // What the device tool brings back: at most 8 plain files, none in a folder, plain names.
  int files = 0;
  for (const auto& entry : fs::directory_iterator(out)) {
    INFO(entry.path());
    CHECK(entry.is_regular_file());
    CHECK(std::regex_match(entry.path().filename().string(), std::regex("[A-Za-z0-9._-]+")));
    ++files;
  }
  CHECK(files <= 8);
  for (const char* name : {"first.log", "first-bench.txt", "first-details.tar.gz"}) {
    INFO(name);
    CHECK(fs::exists(out / name));
  }
}

// cuBLASLt is loaded on first use, so ldd cannot miss it: ptrain devices' "cuBLASLt none" stops
// the check before any step spends the lease.
TEST_CASE("gpu-check.sh stops at once when ptrain devices could not load cuBLASLt", "[gpu-scripts]") {
  TempDir dir("gpu-check-no-cublaslt");
  write_stand_in_bundle(dir.dir, /*with_mpi=*/false);
  const fs::path out = dir.dir / "out";
  const CommandResult r = run_shell(gpu_check("", "STAND_IN_NO_CUBLASLT=1 OUT='" + out.string() + "' PTRAIN_GPU_BUNDLE='" +
                                                      (dir.dir / "bundle.tar.xz").string() + "'"));
  INFO(r.output);
  CHECK(r.exit_code == 1);
  const std::string summary = read_file(out / "first-summary.txt");
  INFO(summary);
  CHECK(has_record(summary, "FAIL", "cuBLASLt could not be loaded (see ptrain devices above): nothing else can run"));
  CHECK(summary.find("\nPASS ") == std::string::npos);
}

TEST_CASE("gpu-check.sh runs ZeRO-0 to ZeRO-3 across GPUs where there are two, or says what it lacks",
          "[gpu-scripts]") {
  TempDir dir("gpu-check-multigpu");
  const bool with_mpi = GENERATE(true, false);
  write_stand_in_bundle(dir.dir, with_mpi);
  // An mpirun first on PATH, so that the step finds one on any machine.
  fs::create_directories(dir.dir / "path");
  write_file(dir.dir / "path/mpirun", "#!/bin/sh\nexit 0\n");
  REQUIRE(run_shell("chmod +x '" + (dir.dir / "path/mpirun").string() + "'").exit_code == 0);
  const fs::path out = dir.dir / "out";
  const CommandResult r = run_shell(gpu_check("", "STAND_IN_GPUS=2 PATH='" + (dir.dir / "path").string() + "':\"$PATH\" OUT='" +
                                                      out.string() + "' PTRAIN_GPU_BUNDLE='" +
                                                      (dir.dir / "bundle.tar.xz").string() + "'"));
  INFO(r.output);
  const std::string summary = read_file(out / "first-summary.txt");
  INFO(summary);
  CHECK(summary.find("cuda:1 NVIDIA H200 (stand-in)") != std::string::npos);
  if (with_mpi) {
    CHECK(has_record(summary, "PASS", "ZeRO-0 to ZeRO-3 on 2 GPUs against 1 (tests/multigpu)"));
    const CommandResult log = run_shell("tar -xzOf '" + (out / "first-details.tar.gz").string() +
                                        "' --wildcards '*ZeRO-0_to_ZeRO-3*.log'");
    CHECK(log.output.find("launcher: " + (dir.dir / "path/mpirun").string()) != std::string::npos);
  } else {
    CHECK(has_record(summary, "SKIP",
                     "ZeRO-0 to ZeRO-3 across GPUs: 2 GPUs, but the step needs a bundle built with MPI "
                     "(PTRAIN_GPU_BUNDLE_MPI=1 scripts/gpu-bundle.sh)"));
  }
}

TEST_CASE("catch_filter escapes what Catch2 reads as a test spec's syntax", "[gpu-scripts]") {
  const CommandResult r = with_lib("catch_filter " + quoted(R"(a, b [c] "d" ~e *f\g)"));
  CHECK(r.exit_code == 0);
  CHECK(r.output == "a\\, b \\[c\\] \\\"d\\\" \\~e \\*f\\\\g\n");
}

#ifdef PTRAIN_HAVE_CUDA
// A build with the CUDA backend has ptrain_gpu_tests beside ptrain (tests/CMakeLists.txt).
TEST_CASE("catch_filter selects each gpu test by its name and no other", "[gpu-scripts]") {
  const std::string gpu_tests = (fs::path(PTRAIN_BINARY).parent_path() / "tests" / "ptrain_gpu_tests").string();
  INFO(gpu_tests);
  REQUIRE(fs::exists(gpu_tests));
  const std::vector<std::string> names = lines_of(run_shell(quoted(gpu_tests) + " --list-test-names-only").output);
  REQUIRE(names.size() > 10);
  bool comma = false;
  for (const std::string& name : names) {
    INFO(name);
    comma = comma || name.find(',') != std::string::npos;
    const CommandResult r = with_lib(quoted(gpu_tests) + " --list-test-names-only \"$(catch_filter " + quoted(name) + ")\"");
    CHECK(r.output == name + "\n");
  }
  CHECK(comma);  // the names the escaping is for
}
#endif

TEST_CASE("gpu-check.sh counts a kernel launched through an _instance variable as reached", "[gpu-scripts]") {
  // Every launch in kernels/ as PTRAIN_KERNEL_LOG records it (the launch's first argument)
  // reaches every __global__ kernel.
  const CommandResult all = with_lib(
      "log=$(mktemp) && grep -ho 'PTRAIN_LAUNCH([A-Za-z0-9_<>]*' kernels/*.cuh | cut -c15- >\"$log\"; "
      "grep -c _instance \"$log\"; kernels_defined kernels | wc -l; cat kernels/*.cuh | grep -c '__global__'; "
      "kernels_not_reached kernels \"$log\"; rm \"$log\"");
  INFO(all.output);
  const std::vector<std::string> counts = lines_of(all.output);
  REQUIRE(counts.size() >= 3);
  CHECK(std::stoi(counts[0]) > 0);      // launches through variables, the case in question
  CHECK(counts[1] == counts[2]);        // a name for each __global__
  CHECK(counts.size() == 3);            // and none not reached

  // A log of two launches against three kernels: the one not launched is named.
  TempDir dir("kernel-log");
  fs::create_directories(dir.dir / "kernels");
  write_file(dir.dir / "kernels/a.cuh",
             "template <typename Dst, typename Src>\n__global__ void convert_kernel(Dst* out, const Src* in) {}\n"
             "template <typename T>\n__global__ void gelu_forward_kernel(T* out) {}\n"
             "__global__ void adamw_kernel(float* p) {}\n");
  write_file(dir.dir / "kernels.txt", "convert_kernel_instance\ngelu_forward_kernel<T>\n");
  const CommandResult r = with_lib("kernels_not_reached " + quoted((dir.dir / "kernels").string()) + " " +
                                   quoted((dir.dir / "kernels.txt").string()));
  CHECK(r.output == "adamw_kernel\n");
}

TEST_CASE("hf-check.sh runs python3 with the library path from before gpu-check.sh's", "[gpu-scripts]") {
  TempDir dir("hf-python");
  write_file(dir.dir / "python3", "#!/bin/sh\necho \"LD_LIBRARY_PATH=$LD_LIBRARY_PATH\"\nexit 1\n");
  fs::permissions(dir.dir / "python3", fs::perms::owner_exec, fs::perm_options::add);
  const std::string hf = "PATH=" + quoted(dir.dir.string()) + ":\"$PATH\" LD_LIBRARY_PATH=/bundle/lib " +
                         quoted((source_dir() / "scripts/hf-check.sh").string());
  // python3 (the stand-in) says what it was given, and hf-check reports it as why it skipped.
  const CommandResult from_gpu_check = run_shell("PTRAIN_ORIGINAL_LD_LIBRARY_PATH=/before " + hf);
  CHECK(from_gpu_check.exit_code == 77);
  CHECK(from_gpu_check.output.find("(LD_LIBRARY_PATH=/before)") != std::string::npos);
  const CommandResult alone = run_shell(hf);
  CHECK(alone.exit_code == 77);
  CHECK(alone.output.find("(LD_LIBRARY_PATH=/bundle/lib)") != std::string::npos);
}

TEST_CASE("ptrain devices names the libraries and why no GPU is usable", "[gpu-scripts]") {
  const fs::path dir = make_temp_dir("devices");
  const CommandResult r = run_ptrain("devices", dir);
  INFO(r.output);
  CHECK(r.exit_code == 0);
#ifdef PTRAIN_HAVE_CUDA
  CHECK(r.output.find("built against CUDA ") != std::string::npos);
  CHECK(r.output.find("loaded: CUDA runtime ") != std::string::npos);
  CHECK(r.output.find(", cuDNN 9.") != std::string::npos);
#endif
  // This machine may have a GPU; then it is listed, else the reason is.
  CHECK((r.output.find("no usable CUDA device: ") != std::string::npos ||
         r.output.find("cuda:0 ") != std::string::npos));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace ptrain::test
