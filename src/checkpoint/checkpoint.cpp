#include "checkpoint/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "checkpoint/sha256.h"
#include "core/error.h"

namespace fs = std::filesystem;

namespace ptrain {
namespace {

constexpr const char* kWeightsFile = "weights.safetensors";
constexpr const char* kOptimizerFile = "optimizer.safetensors";
constexpr const char* kStateFile = "state.json";
constexpr const char* kLatestFile = "latest";

std::string step_dir_name(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step_%08lld", static_cast<long long>(step));
  return name;
}

// fsync a file or directory so a rename that follows is durable.
void sync_path(const fs::path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw UserError("cannot open \"" + p.string() + "\" to sync it: " + std::strerror(errno));
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw UserError("cannot sync \"" + p.string() + "\": " + std::strerror(errno));
}

void write_text_synced(const fs::path& p, const std::string& text) {
  {
    std::ofstream out(p, std::ios::trunc);
    out << text;
    out.flush();
    if (!out) throw UserError("cannot write \"" + p.string() + "\"");
  }
  sync_path(p);
}

// Host copies of tensors (which may live in device memory), kept alive while a file is written.
struct HostTensors {
  std::vector<std::vector<float>> buffers;
  std::vector<SafetensorView> views;
  void add(Backend& backend, const std::string& name, const std::vector<int64_t>& shape, const Tensor& t) {
    buffers.emplace_back(static_cast<size_t>(t.numel()));
    backend.download(buffers.back().data(), t);
    views.push_back({name, shape, buffers.back().data()});
  }
};

// The master weights (or the FP32 parameters), one entry per parameter tensor.
HostTensors weight_copies(Gpt& model) {
  HostTensors host;
  host.buffers.reserve(kNumParams);
  for (int i = 0; i < kNumParams; ++i)
    host.add(model.backend(), model.specs()[i].name, model.specs()[i].shape, model.master(static_cast<ParamId>(i)));
  return host;
}

HostTensors moment_copies(Gpt& model, AdamW& optimizer) {
  HostTensors host;
  host.buffers.reserve(2 * kNumParams);
  int64_t offset = 0;
  for (int i = 0; i < kNumParams; ++i) {
    const auto& spec = model.specs()[i];
    const int64_t n = model.param(static_cast<ParamId>(i)).numel();
    host.add(model.backend(), "m." + spec.name, spec.shape, optimizer.first_moment().range(offset, n));
    host.add(model.backend(), "v." + spec.name, spec.shape, optimizer.second_moment().range(offset, n));
    offset += n;
  }
  return host;
}

// Reads tensor `name` of a checkpoint file into `dst` (possibly device memory).
void read_into(const SafetensorsFile& file, const std::string& name, Backend& backend, const Tensor& dst) {
  std::vector<float> host(static_cast<size_t>(dst.numel()));
  file.copy_to(name, host.data(), dst.numel());
  backend.upload(dst, host.data());
}

// A short fingerprint of the model-relevant config, for tools that compare checkpoints.
std::string model_hash(const nlohmann::json& model) {
  const std::string text = model.dump();
  Sha256 h;
  h.update(text.data(), text.size());
  return h.hex_digest().substr(0, 16);
}

// FP8 histories may hold NaN or inf (an overflowed step), which JSON cannot: they are stored as
// the floats' bit patterns, exact whatever the value.
std::vector<uint32_t> float_bits(const std::vector<float>& values) {
  std::vector<uint32_t> bits(values.size());
  std::memcpy(bits.data(), values.data(), values.size() * sizeof(float));
  return bits;
}

std::vector<float> bits_float(const std::vector<uint32_t>& bits) {
  std::vector<float> values(bits.size());
  std::memcpy(values.data(), bits.data(), bits.size() * sizeof(float));
  return values;
}

nlohmann::json state_to_json(const CheckpointState& s) {
  nlohmann::json fp8 = nlohmann::json::array();
  for (const auto& f : s.fp8)
    fp8.push_back({{"name", f.name},
                   {"history_bits", float_bits(f.history)},
                   {"scale_bits", float_bits({f.scale})[0]},
                   {"scale", std::isfinite(f.scale) ? nlohmann::json(f.scale) : nlohmann::json()}});  // for people
  return {{"format", "ptrain checkpoint 1"},
          {"step", s.step},
          {"tokens", s.tokens},
          {"optimizer_steps", s.optimizer_steps},
          // The only random state after initialisation: the counter-based training sampler.
          {"rng", {{"data_sampler", {{"seed", s.data_seed}, {"next_sample", s.next_sample}}}}},
          {"loss_scaler",
           {{"mode", s.scaler_mode},
            {"scale", s.scaler.scale},
            {"growth_tracker", s.scaler.growth_tracker},
            {"hysteresis_left", s.scaler.hysteresis_left},
            {"skipped", s.scaler.skipped}}},
          {"fp8", fp8},
          {"best_val_loss", s.best_val_loss},
          {"best_val_step", s.best_val_step},
          {"precision", s.precision},
          {"model", s.model},
          {"model_hash", model_hash(s.model)},
          {"schedule", s.schedule}};
}

CheckpointState state_from_json(const nlohmann::json& j) {
  CheckpointState s;
  j.at("step").get_to(s.step);
  j.at("tokens").get_to(s.tokens);
  j.at("optimizer_steps").get_to(s.optimizer_steps);
  j.at("rng").at("data_sampler").at("seed").get_to(s.data_seed);
  j.at("rng").at("data_sampler").at("next_sample").get_to(s.next_sample);
  const auto& ls = j.at("loss_scaler");
  ls.at("mode").get_to(s.scaler_mode);
  ls.at("scale").get_to(s.scaler.scale);
  ls.at("growth_tracker").get_to(s.scaler.growth_tracker);
  ls.at("hysteresis_left").get_to(s.scaler.hysteresis_left);
  ls.at("skipped").get_to(s.scaler.skipped);
  for (const auto& f : j.at("fp8"))
    s.fp8.push_back({f.at("name").get<std::string>(), bits_float(f.at("history_bits").get<std::vector<uint32_t>>()),
                     bits_float({f.at("scale_bits").get<uint32_t>()})[0]});
  if (j.at("best_val_loss").is_number()) j.at("best_val_loss").get_to(s.best_val_loss);
  j.at("best_val_step").get_to(s.best_val_step);
  j.at("precision").get_to(s.precision);
  s.model = j.at("model");
  s.schedule = j.at("schedule");
  return s;
}

int64_t step_of(const std::string& name) {
  if (name.size() != 13 || name.rfind("step_", 0) != 0) return -1;
  for (size_t i = 5; i < name.size(); ++i)
    if (name[i] < '0' || name[i] > '9') return -1;
  return std::stoll(name.substr(5));
}

// Checkpoint directories under `dir`, newest first (temporary ones are not checkpoints).
std::vector<fs::path> checkpoint_dirs(const fs::path& dir) {
  std::vector<std::pair<int64_t, fs::path>> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (entry.is_directory() && step_of(entry.path().filename().string()) >= 0)
      found.emplace_back(step_of(entry.path().filename().string()), entry.path());
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<fs::path> out;
  for (auto& f : found) out.push_back(f.second);
  return out;
}

}  // namespace

std::string save_checkpoint(const std::string& dir, const CheckpointState& state, Gpt& model, AdamW& optimizer,
                            int keep_last) {
  const fs::path root(dir);
  const fs::path final_dir = root / step_dir_name(state.step);
  const fs::path tmp_dir = root / ("." + step_dir_name(state.step) + ".tmp");
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) throw UserError("checkpoint.dir: cannot create \"" + root.string() + "\": " + ec.message());
  fs::remove_all(tmp_dir, ec);  // the leftover of an interrupted save of this step
  if (!fs::create_directory(tmp_dir, ec) || ec)
    throw UserError("checkpoint.dir: cannot create \"" + tmp_dir.string() + "\": " + ec.message());

  try {
    write_safetensors((tmp_dir / kWeightsFile).string(), weight_copies(model).views,
                      {{"format", "pt"}, {"producer", "ptrain"}});
    write_safetensors((tmp_dir / kOptimizerFile).string(), moment_copies(model, optimizer).views,
                      {{"producer", "ptrain"}});
    nlohmann::json j = state_to_json(state);
    for (const char* f : {kWeightsFile, kOptimizerFile}) j["sha256"][f] = sha256_file((tmp_dir / f).string());
    write_text_synced(tmp_dir / kStateFile, j.dump(2) + "\n");
    sync_path(tmp_dir);
    fs::remove_all(final_dir, ec);  // a checkpoint of the same step from an earlier attempt
    fs::rename(tmp_dir, final_dir);
    sync_path(root);
    const fs::path latest_tmp = root / (std::string(kLatestFile) + ".tmp");
    write_text_synced(latest_tmp, final_dir.filename().string() + "\n");
    fs::rename(latest_tmp, root / kLatestFile);
    sync_path(root);
  } catch (const fs::filesystem_error& e) {
    fs::remove_all(tmp_dir, ec);
    throw UserError(std::string("cannot save checkpoint: ") + e.what());
  } catch (...) {
    fs::remove_all(tmp_dir, ec);
    throw;
  }

  // Keep the newest keep_last checkpoints up to this one (later steps were set aside at resume).
  size_t kept = 0;
  for (const fs::path& p : checkpoint_dirs(root))
    if (step_of(p.filename().string()) <= state.step && ++kept > static_cast<size_t>(std::max(keep_last, 1)))
      fs::remove_all(p, ec);
  return final_dir.string();
}

LoadedCheckpoint load_checkpoint(const std::string& path) {
  const fs::path dir(path);
  auto invalid = [&](const std::string& what) {
    return UserError("checkpoint \"" + path + "\" is not usable: " + what);
  };
  if (!fs::is_directory(dir)) throw invalid("not a directory");
  if (!fs::exists(dir / kStateFile)) throw invalid(std::string("no ") + kStateFile + " (an incomplete save?)");
  nlohmann::json j;
  try {
    std::ifstream in(dir / kStateFile);
    j = nlohmann::json::parse(in);
    if (j.value("format", "") != "ptrain checkpoint 1") throw invalid("state.json is not a ptrain checkpoint state");
    for (const char* f : {kWeightsFile, kOptimizerFile}) {
      const std::string expected = j.at("sha256").at(f).get<std::string>();
      if (!fs::exists(dir / f)) throw invalid(std::string(f) + " is missing");
      if (sha256_file((dir / f).string()) != expected)
        throw invalid(std::string(f) + " does not match its SHA-256 in state.json (truncated or corrupted)");
    }
    CheckpointState state = state_from_json(j);
    return {path, std::move(state), SafetensorsFile((dir / kWeightsFile).string()),
            SafetensorsFile((dir / kOptimizerFile).string())};
  } catch (const nlohmann::json::exception& e) {
    throw invalid(std::string("state.json is malformed (") + e.what() + ")");
  }
}

std::vector<std::string> set_aside_later_checkpoints(const std::string& dir, int64_t step) {
  std::vector<std::string> moved;
  for (const fs::path& p : checkpoint_dirs(dir)) {
    if (step_of(p.filename().string()) <= step) continue;
    const fs::path aside = p.string() + ".superseded";
    std::error_code ec;
    fs::remove_all(aside, ec);
    fs::rename(p, aside, ec);
    if (ec) throw EnvironmentError("cannot set aside \"" + p.string() + "\": " + ec.message());
    moved.push_back(aside.string());
  }
  return moved;
}

std::optional<LoadedCheckpoint> find_latest_checkpoint(const std::string& dir,
                                                       const std::function<void(const std::string&)>& warn) {
  for (const fs::path& candidate : checkpoint_dirs(dir)) {
    try {
      return load_checkpoint(candidate.string());
    } catch (const UserError& e) {
      warn(std::string(e.what()) + "; trying the previous checkpoint");
    }
  }
  return std::nullopt;
}

void load_weights(const SafetensorsFile& weights, Gpt& model) {
  for (int i = 0; i < kNumParams; ++i) {
    const auto id = static_cast<ParamId>(i);
    read_into(weights, model.specs()[i].name, model.backend(), model.master(id));
  }
  model.sync_params_from_master();
}

void restore_tensors(const LoadedCheckpoint& checkpoint, Gpt& model, AdamW& optimizer) {
  load_weights(checkpoint.weights, model);
  int64_t offset = 0;
  for (int i = 0; i < kNumParams; ++i) {
    const std::string& name = model.specs()[i].name;
    const int64_t n = model.param(static_cast<ParamId>(i)).numel();
    read_into(checkpoint.optimizer, "m." + name, model.backend(), optimizer.first_moment().range(offset, n));
    read_into(checkpoint.optimizer, "v." + name, model.backend(), optimizer.second_moment().range(offset, n));
    offset += n;
  }
  optimizer.restore_steps(checkpoint.state.optimizer_steps);
}

nlohmann::json model_json(const ModelConfig& m) {
  return {{"n_layer", m.n_layer}, {"n_head", m.n_head}, {"n_embd", m.n_embd}, {"seq_len", m.seq_len},
          {"vocab_size", m.vocab_size}};
}

ModelConfig model_from_json(const nlohmann::json& j) {
  ModelConfig m;
  j.at("n_layer").get_to(m.n_layer);
  j.at("n_head").get_to(m.n_head);
  j.at("n_embd").get_to(m.n_embd);
  j.at("seq_len").get_to(m.seq_len);
  j.at("vocab_size").get_to(m.vocab_size);
  return m;
}

std::vector<std::string> model_differences(const nlohmann::json& saved, const nlohmann::json& current) {
  std::vector<std::string> out;
  for (const auto& [key, value] : current.items())
    if (!saved.contains(key) || saved[key] != value)
      out.push_back("model." + key + " " + (saved.contains(key) ? saved[key].dump() : "absent") + " in the checkpoint vs " +
                    value.dump() + " now");
  return out;
}

}  // namespace ptrain
