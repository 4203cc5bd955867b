// Helpers shared by the tests: seeded host buffers viewed as Tensors, error norms that never
// let NaN pass, temporary directories and running the ptrain binary.
#pragma once

#include <sys/wait.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"
#include "model/param_layout.h"

namespace ptrain::test {

template <typename T>
struct HostBuffer {
  std::vector<T> data;
  std::vector<int64_t> shape;
  HostBuffer(std::vector<int64_t> dims, T fill = T(0)) : shape(std::move(dims)) {
    data.assign(static_cast<size_t>(shape_numel(shape)), fill);
  }
  Tensor view() {
    DType dt = std::is_same<T, double>::value ? DType::f64 : std::is_same<T, float>::value ? DType::f32 : DType::i32;
    return Tensor(data.data(), dt, shape);
  }
  size_t size() const { return data.size(); }
};

template <typename T>
void fill_normal(std::vector<T>& v, uint64_t seed, double scale = 1.0) {
  Rng rng(seed, 99);
  for (auto& x : v) x = static_cast<T>(rng.normal() * scale);
}

// ||a - b|| / ||b||; NaN anywhere gives infinity so a comparison can never pass on NaN.
template <typename A, typename B>
double relative_error(const std::vector<A>& a, const std::vector<B>& b) {
  if (a.size() != b.size()) return INFINITY;
  double diff = 0, ref = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = static_cast<double>(a[i]), y = static_cast<double>(b[i]);
    if (std::isnan(x) || std::isnan(y)) return INFINITY;
    diff += (x - y) * (x - y);
    ref += y * y;
  }
  if (ref == 0) return diff == 0 ? 0 : INFINITY;
  return std::sqrt(diff / ref);
}

template <typename T>
double norm(const std::vector<T>& v) {
  double s = 0;
  for (T x : v) s += static_cast<double>(x) * static_cast<double>(x);
  return std::sqrt(s);
}

inline std::filesystem::path make_temp_dir(const std::string& tag) {
  std::string pattern = (std::filesystem::temp_directory_path() / ("ptrain-" + tag + "-XXXXXX")).string();
  char* made = mkdtemp(pattern.data());
  if (!made) throw std::runtime_error("mkdtemp failed");
  return made;
}

inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void write_file(const std::filesystem::path& p, const std::string& text) { std::ofstream(p) << text; }

// One JSON object per line of a run's metrics.jsonl.
inline std::vector<nlohmann::json> read_metrics(const std::filesystem::path& file) {
  std::vector<nlohmann::json> records;
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) records.push_back(nlohmann::json::parse(line));
  return records;
}

// Each step's loss in a run's metrics.jsonl; a step logged twice (a rollback replays it) by its
// last record.
inline std::map<int64_t, double> losses_by_step(const std::filesystem::path& metrics) {
  std::map<int64_t, double> out;
  for (const auto& m : read_metrics(metrics))
    if (m.contains("loss")) out[m["step"].get<int64_t>()] = m["loss"].get<double>();
  return out;
}

// The records of a run's metrics.jsonl that hold `key` ("guard", "resume", "precision_phase"...), in order.
inline std::vector<nlohmann::json> records_with(const std::filesystem::path& metrics, const std::string& key) {
  std::vector<nlohmann::json> out;
  for (auto& m : read_metrics(metrics))
    if (m.contains(key)) out.push_back(std::move(m));
  return out;
}

// The {"step", "path"} of each checkpoint saved, in order, from a run's metrics.jsonl (a rollback's
// record names its checkpoint too, as a string: it saved nothing and is left out).
inline std::vector<nlohmann::json> checkpoints_saved(const std::filesystem::path& metrics) {
  std::vector<nlohmann::json> out;
  for (const auto& m : records_with(metrics, "checkpoint"))
    if (m["checkpoint"].is_object()) out.push_back(m["checkpoint"]);
  return out;
}

// Non-overlapping occurrences of `what` in `text`.
inline size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}

// A temporary directory, removed however the test ends.
struct TempDir {
  std::filesystem::path dir;
  explicit TempDir(const std::string& tag) : dir(make_temp_dir(tag)) {}
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

struct CommandResult {
  int exit_code;
  std::string output;  // stdout and stderr together
};

// Runs a shell command, stdout and stderr together.
inline CommandResult run_shell(const std::string& command) {
  const std::string cmd = command + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) throw std::runtime_error("popen failed");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// The ptrain binary the tests run: the build's, compiled in as an absolute path, unless the
// environment's PTRAIN_BINARY names another (a test binary carried to another machine with its
// ptrain, scripts/gpu-bundle.sh).
inline std::string ptrain_binary() {
  const char* path = std::getenv("PTRAIN_BINARY");
  return path && *path ? path : PTRAIN_BINARY;
}

#ifdef PTRAIN_SOURCE_DIR
// The source tree (test fixtures): compiled in, unless the environment's PTRAIN_SOURCE_DIR names
// another checkout.
inline std::filesystem::path source_dir() {
  const char* path = std::getenv("PTRAIN_SOURCE_DIR");
  return path && *path ? path : PTRAIN_SOURCE_DIR;
}
#endif

// Runs the ptrain binary with `args` (a shell-quoted string) from directory `cwd`.
inline CommandResult run_ptrain(const std::string& args, const std::filesystem::path& cwd,
                                const std::string& env = "") {
  return run_shell("cd '" + cwd.string() + "' && " + env + " '" + ptrain_binary() + "' " + args);
}

// A Llama-style shape of s's size: n_kv_head K/V heads, SwiGLU width `hidden`, LM head tied or not.
inline ModelShape llama_shape(ModelShape s, int n_kv_head, int hidden, bool tied = false) {
  s.arch = Arch::llama;
  s.n_kv_head = n_kv_head;
  s.swiglu_width = hidden;
  s.tied_head = tied;
  return s;
}

// The same with QK-norm (model.qk_norm).
inline ModelShape with_qk_norm(ModelShape s) {
  s.qk_norm = true;
  return s;
}

}  // namespace ptrain::test
