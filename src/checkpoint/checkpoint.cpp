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

// ZeRO-1: rank r's moments, e.g. "optimizer.rank00001-of-00002.safetensors".
std::string moment_shard_file(int rank, int world) {
  char name[64];
  std::snprintf(name, sizeof name, "optimizer.rank%05d-of-%05d.safetensors", rank, world);
  return name;
}

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
                            int keep_last, Communicator* comm) {
  const bool main = !comm || comm->is_main();
  const int rank = comm ? comm->rank() : 0, world = comm ? comm->world_size() : 1;
  const fs::path root(dir);
  const fs::path final_dir = root / step_dir_name(state.step);
  const fs::path tmp_dir = root / ("." + step_dir_name(state.step) + ".tmp");
  std::error_code ec;
  // Every rank learns whether any rank failed, so that all stop (or continue) together; the
  // failing rank's own message goes to its stderr (only rank 0 logs) and into its exception.
  std::string error;
  const auto agree = [&](const char* stage) {
    const double failed = comm ? comm->all_reduce_sum(error.empty() ? 0.0 : 1.0) : (error.empty() ? 0.0 : 1.0);
    if (failed == 0) return;
    if (main) fs::remove_all(tmp_dir, ec);
    if (!error.empty() && !main) std::fprintf(stderr, "ptrain: rank %d: %s\n", rank, error.c_str());
    throw UserError(!error.empty() ? error
                                   : "cannot save checkpoint: " + std::to_string(static_cast<int>(failed)) +
                                         " other rank(s) failed while writing " + stage + " (their stderr says why)");
  };
  const auto attempt = [&](auto&& fn) {
    try {
      fn();
    } catch (const fs::filesystem_error& e) {
      error = std::string("cannot save checkpoint: ") + e.what();
    } catch (const UserError& e) {
      error = e.what();
    }
  };

  if (main)
    attempt([&] {
      fs::create_directories(root, ec);
      if (ec) throw UserError("checkpoint.dir: cannot create \"" + root.string() + "\": " + ec.message());
      fs::remove_all(tmp_dir, ec);  // the leftover of an interrupted save of this step
      if (!fs::create_directory(tmp_dir, ec) || ec)
        throw UserError("checkpoint.dir: cannot create \"" + tmp_dir.string() + "\": " + ec.message());
    });
  agree("the temporary directory");

  // ZeRO-1 keeps the FP32 master weights in shards: rank 0 gathers them for weights.safetensors.
  std::vector<float> master;
  if (!optimizer.master_shard().empty()) {
    std::vector<float> shard(static_cast<size_t>(optimizer.shard().count));
    model.backend().download(shard.data(), optimizer.master_shard());
    if (main) master.resize(static_cast<size_t>(model.num_params()));
    comm->gather_shards(main ? master.data() : nullptr, shard.data(), model.num_params());
  }
  // ZeRO-1: each rank writes the moments of its shard of the flat parameter vector.
  if (optimizer.sharded())
    attempt([&] {
      const Shard s = optimizer.shard();
      HostTensors host;
      host.add(model.backend(), "m", {s.count}, optimizer.first_moment());
      host.add(model.backend(), "v", {s.count}, optimizer.second_moment());
      const fs::path path = tmp_dir / moment_shard_file(rank, world);
      write_safetensors(path.string(), host.views,
                        {{"producer", "ptrain"}, {"begin", std::to_string(s.begin)}, {"count", std::to_string(s.count)}});
      sync_path(path);
    });
  agree("their optimizer shards");

  if (main)
    attempt([&] {
      if (master.empty()) {
        write_safetensors((tmp_dir / kWeightsFile).string(), weight_copies(model).views,
                          {{"format", "pt"}, {"producer", "ptrain"}});
      } else {
        std::vector<SafetensorView> views;
        int64_t offset = 0;
        for (int i = 0; i < kNumParams; ++i) {
          views.push_back({model.specs()[i].name, model.specs()[i].shape, master.data() + offset});
          offset += model.param(static_cast<ParamId>(i)).numel();
        }
        write_safetensors((tmp_dir / kWeightsFile).string(), views, {{"format", "pt"}, {"producer", "ptrain"}});
      }
      nlohmann::json j = state_to_json(state);
      j["sha256"][kWeightsFile] = sha256_file((tmp_dir / kWeightsFile).string());
      if (optimizer.sharded()) {
        for (int r = 0; r < world; ++r) {
          const Shard s = shard_of(model.num_params(), r, world);
          const std::string file = moment_shard_file(r, world);
          j["optimizer_shards"].push_back({{"file", file}, {"begin", s.begin}, {"count", s.count}});
          j["sha256"][file] = sha256_file((tmp_dir / file).string());
        }
      } else {
        write_safetensors((tmp_dir / kOptimizerFile).string(), moment_copies(model, optimizer).views,
                          {{"producer", "ptrain"}});
        j["sha256"][kOptimizerFile] = sha256_file((tmp_dir / kOptimizerFile).string());
      }
      write_text_synced(tmp_dir / kStateFile, j.dump(2) + "\n");
      sync_path(tmp_dir);
      fs::remove_all(final_dir, ec);  // a checkpoint of the same step from an earlier attempt
      fs::rename(tmp_dir, final_dir);
      sync_path(root);
      const fs::path latest_tmp = root / (std::string(kLatestFile) + ".tmp");
      write_text_synced(latest_tmp, final_dir.filename().string() + "\n");
      fs::rename(latest_tmp, root / kLatestFile);
      sync_path(root);
    });
  agree("the checkpoint");

  // Keep the newest keep_last checkpoints up to this one (later steps were set aside at resume).
  if (main) {
    size_t kept = 0;
    for (const fs::path& p : checkpoint_dirs(root))
      if (step_of(p.filename().string()) <= state.step && ++kept > static_cast<size_t>(std::max(keep_last, 1)))
        fs::remove_all(p, ec);
  }
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
    const nlohmann::json& sums = j.at("sha256");
    const bool sharded = j.contains("optimizer_shards");
    for (const char* f : {kWeightsFile, kOptimizerFile})
      if ((f == kWeightsFile || !sharded) && !sums.contains(f)) throw invalid(std::string("state.json lists no ") + f);
    for (const auto& [file, expected] : sums.items()) {
      if (!fs::exists(dir / file)) throw invalid(file + " is missing");
      if (sha256_file((dir / file).string()) != expected.get<std::string>())
        throw invalid(file + " does not match its SHA-256 in state.json (truncated or corrupted)");
    }
    LoadedCheckpoint loaded{path, state_from_json(j), SafetensorsFile((dir / kWeightsFile).string()), std::nullopt, {}};
    if (!sharded) {
      loaded.optimizer.emplace((dir / kOptimizerFile).string());
      return loaded;
    }
    int64_t covered = 0;  // the shards must tile the flat parameter vector in order
    for (const auto& s : j.at("optimizer_shards")) {
      const std::string file = s.at("file").get<std::string>();
      if (!sums.contains(file)) throw invalid(file + " has no SHA-256 in state.json");
      MomentShard shard{s.at("begin").get<int64_t>(), s.at("count").get<int64_t>(),
                        SafetensorsFile((dir / file).string())};
      if (shard.begin != covered) throw invalid("the optimizer shards do not tile the parameters (" + file + ")");
      covered += shard.count;
      loaded.shards.push_back(std::move(shard));
    }
    loaded.sharded_params = covered;
    return loaded;
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

// Elements [begin, begin + count) of the flat moment vector `which` ("m" or "v"), from whichever
// layout the checkpoint has: per-tensor (optimizer.safetensors) or ZeRO-1 shards. So a run resumes
// at any world size and ZeRO stage, exactly.
std::vector<float> read_moments(const LoadedCheckpoint& checkpoint, const Gpt& model, const std::string& which,
                                int64_t begin, int64_t count) {
  std::vector<float> out(static_cast<size_t>(count)), part;
  const auto take = [&](int64_t part_begin, int64_t part_count, const auto& fill) {
    const int64_t lo = std::max(begin, part_begin), hi = std::min(begin + count, part_begin + part_count);
    if (lo >= hi) return;
    part.resize(static_cast<size_t>(part_count));
    fill(part.data());
    std::copy(part.begin() + (lo - part_begin), part.begin() + (hi - part_begin), out.begin() + (lo - begin));
  };
  if (checkpoint.optimizer) {
    int64_t offset = 0;
    for (int i = 0; i < kNumParams; ++i) {
      const int64_t n = model.param(static_cast<ParamId>(i)).numel();
      take(offset, n, [&](float* dst) { checkpoint.optimizer->copy_to(which + "." + model.specs()[i].name, dst, n); });
      offset += n;
    }
    return out;
  }
  if (checkpoint.sharded_params != model.num_params())
    throw UserError("checkpoint \"" + checkpoint.path + "\": its optimizer shards cover " +
                    std::to_string(checkpoint.sharded_params) + " parameters; the model has " +
                    std::to_string(model.num_params()));
  for (const MomentShard& s : checkpoint.shards)
    take(s.begin, s.count, [&](float* dst) { s.file.copy_to(which, dst, s.count); });
  return out;
}

void restore_tensors(const LoadedCheckpoint& checkpoint, Gpt& model, AdamW& optimizer) {
  load_weights(checkpoint.weights, model);
  const Shard s = optimizer.shard();
  for (const auto& [which, moment] : {std::pair{"m", optimizer.first_moment()}, {"v", optimizer.second_moment()}})
    model.backend().upload(moment, read_moments(checkpoint, model, which, s.begin, s.count).data());
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
