#include "checkpoint/checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <regex>

#include "core/error.h"
#include "core/input_file.h"
#include "core/json_input.h"
#include "core/output_file.h"
#include "core/paths.h"

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

bool is_checkpoint_file_name(const std::string& name) {
  static const std::regex shard(R"(optimizer\.rank[0-9]{5}-of-[0-9]{5}\.safetensors)");
  return name == kWeightsFile || name == kOptimizerFile || std::regex_match(name, shard);
}

std::string step_dir_name(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step_%08lld", static_cast<long long>(step));
  return name;
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
HostTensors weight_copies(Transformer& model) {
  HostTensors host;
  host.buffers.reserve(model.specs().size());
  for (const ParamSpec& spec : model.specs()) host.add(model.backend(), spec.name, spec.shape, model.master(spec.id));
  return host;
}

HostTensors moment_copies(Transformer& model, AdamW& optimizer) {
  HostTensors host;
  host.buffers.reserve(2 * model.specs().size());
  int64_t offset = 0;
  for (const ParamSpec& spec : model.specs()) {
    const int64_t n = model.param(spec.id).numel();
    host.add(model.backend(), "m." + spec.name, spec.shape, optimizer.first_moment().range(offset, n));
    host.add(model.backend(), "v." + spec.name, spec.shape, optimizer.second_moment().range(offset, n));
    offset += n;
  }
  return host;
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
    if (entry.is_directory(ec) && step_of(entry.path().filename().string()) >= 0)
      found.emplace_back(step_of(entry.path().filename().string()), entry.path());
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<fs::path> out;
  for (auto& f : found) out.push_back(f.second);
  return out;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + ")";
}

// Every tensor `file` must hold for the model, of exactly its shape: a crafted state.json can
// then never size an allocation the files do not back.
void expect_tensors(const SafetensorsFile& file, const std::string& file_name, const std::vector<ParamSpec>& specs,
                    const std::string& prefix) {
  for (const ParamSpec& spec : specs) {
    const std::string name = prefix + spec.name;
    if (!file.has(name)) throw UserError(file_name + " has no tensor " + name);
    if (file.shape(name) != spec.shape)
      throw UserError(file_name + ": tensor " + name + " has shape " + shape_text(file.shape(name)) +
                      ", but state.json's model needs " + shape_text(spec.shape));
  }
}

void expect_finite(const SafetensorsFile& file, const std::string& file_name) {
  int64_t at = 0;
  const std::string tensor = file.first_non_finite(&at);
  if (!tensor.empty())
    throw UserError(file_name + ": tensor " + tensor + " holds a NaN or infinity (element " + std::to_string(at) +
                    "); a checkpoint to train from must hold finite values");
}

// A checkpoint directory, or the directory a `latest` file names.
fs::path checkpoint_directory(const std::string& path) {
  const PathKind kind = path_kind(path, "checkpoint");
  if (kind == PathKind::missing) throw UserError("does not exist");
  if (kind == PathKind::directory) return path;
  if (fs::path(path).filename() != kLatestFile) throw UserError("is a file; expected a checkpoint directory (step_NNNNNNNN)");
  std::string name = InputFile(path, "\"" + path + "\"").read_all(256);
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  if (step_of(name) < 0) throw UserError("names \"" + name + "\"; expected a checkpoint directory name (step_NNNNNNNN)");
  return fs::path(path).parent_path() / name;
}

LoadedCheckpoint load_verified(const std::string& path) {
  const fs::path dir = checkpoint_directory(path);
  if (path_kind((dir / kStateFile).string(), "state.json") == PathKind::missing)
    throw UserError(std::string("no ") + kStateFile + " (an incomplete save?)");
  check_link_stays_inside(dir.string(), kStateFile, "checkpoint");
  const nlohmann::json j = parse_json(InputFile((dir / kStateFile).string(), kStateFile).read_all(kMaxStateBytes), kStateFile);
  CheckpointState state = state_from_json(j);
  if (!j.contains("sha256") || !j["sha256"].is_object())
    throw UserError("state.json has no sha256 object naming its files");
  const nlohmann::json& sums = j["sha256"];
  const bool sharded = j.contains("optimizer_shards");
  for (const char* f : {kWeightsFile, kOptimizerFile})
    if ((f == kWeightsFile || !sharded) && !sums.contains(f)) throw UserError(std::string("state.json lists no ") + f);

  // Each listed file is read once, and its checksum taken from the same bytes that are parsed.
  std::map<std::string, SafetensorsFile> files;
  for (const auto& [file, expected] : sums.items()) {
    if (!is_checkpoint_file_name(file))
      throw UserError("state.json lists \"" + file + "\", which is not a checkpoint file name");
    if (!expected.is_string()) throw UserError("state.json's sha256 of " + file + " is not a string");
    if (path_kind((dir / file).string(), file) == PathKind::missing) throw UserError(file + " is missing");
    check_link_stays_inside(dir.string(), file, "checkpoint");
    files.emplace(file, SafetensorsFile::read_checked((dir / file).string(), expected.get<std::string>()));
  }

  const ModelConfig model = model_from_json(state.model);
  const std::vector<ParamSpec> specs = param_specs(ModelShape::of(model));
  const int64_t num_params = param_count(ModelShape::of(model));
  SafetensorsFile& weights = files.at(kWeightsFile);
  expect_tensors(weights, kWeightsFile, specs, "");
  expect_finite(weights, kWeightsFile);
  LoadedCheckpoint loaded{path, std::move(state), std::move(weights), std::nullopt, {}};
  if (!sharded) {
    SafetensorsFile& moments = files.at(kOptimizerFile);
    expect_tensors(moments, kOptimizerFile, specs, "m.");
    expect_tensors(moments, kOptimizerFile, specs, "v.");
    expect_finite(moments, kOptimizerFile);
    loaded.optimizer.emplace(std::move(moments));
    return loaded;
  }
  const nlohmann::json& shards = j["optimizer_shards"];
  if (!shards.is_array() || shards.empty()) throw UserError("state.json's optimizer_shards is not a list of shards");
  int64_t covered = 0;  // the shards must tile the flat parameter vector in order
  for (const auto& s : shards) {
    if (!s.is_object() || !s.contains("file") || !s["file"].is_string() || !s.contains("begin") ||
        !s["begin"].is_number_integer() || !s.contains("count") || !s["count"].is_number_integer())
      throw UserError("state.json's optimizer_shards holds an entry without file, begin and count");
    const std::string file = s["file"].get<std::string>();
    const auto found = files.find(file);
    if (found == files.end()) throw UserError(file + " has no SHA-256 in state.json");
    const int64_t begin = s["begin"].get<int64_t>(), count = s["count"].get<int64_t>();
    if (begin != covered || count < 0 || count > num_params - covered)
      throw UserError("the optimizer shards do not tile the model's " + std::to_string(num_params) + " parameters (" +
                      file + ")");
    for (const char* moment : {"m", "v"})
      if (!found->second.has(moment) || found->second.shape(moment) != std::vector<int64_t>{count})
        throw UserError(file + " has no tensor " + moment + " of shape (" + std::to_string(count) + ")");
    expect_finite(found->second, file);
    covered += count;
    loaded.shards.push_back({begin, count, std::move(found->second)});
  }
  if (covered != num_params)
    throw UserError("the optimizer shards cover " + std::to_string(covered) + " of the model's " +
                    std::to_string(num_params) + " parameters");
  return loaded;
}

}  // namespace

std::string save_checkpoint(const std::string& dir, const CheckpointState& state, Transformer& model, AdamW& optimizer,
                            int keep_last, Communicator* comm, const std::function<void()>& before_publish) {
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
    throw EnvironmentError(!error.empty() ? error
                                          : "cannot save checkpoint: " + std::to_string(static_cast<int>(failed)) +
                                                " other rank(s) failed while writing " + stage + " (their stderr says why)");
  };
  const auto attempt = [&](auto&& fn) {
    try {
      fn();
    } catch (const fs::filesystem_error& e) {
      error = std::string("cannot save checkpoint: ") + e.what();
    } catch (const EnvironmentError& e) {
      error = e.what();
    } catch (const UserError& e) {
      error = e.what();
    }
  };

  if (main)
    attempt([&] {
      fs::create_directories(root, ec);
      if (ec) throw EnvironmentError("cannot create \"" + root.string() + "\": " + ec.message());
      fs::remove_all(tmp_dir, ec);  // the leftover of an interrupted save of this step
      if (!fs::create_directory(tmp_dir, ec) || ec)
        throw EnvironmentError("cannot create \"" + tmp_dir.string() + "\": " + ec.message());
    });
  agree("the temporary directory");

  // ZeRO-1 to 3 keep the FP32 master weights in shards (ZeRO-3 in fp32 the weights themselves):
  // rank 0 gathers them for weights.safetensors.
  std::vector<float> master;
  if (!optimizer.master_shard().empty() || model.has_sharded_params()) master = optimizer.master_on_main();
  // ZeRO-1: each rank writes the moments of its shard of the flat parameter vector; rank 0
  // checks the other ranks' files when it records their checksums.
  if (optimizer.sharded())
    attempt([&] {
      const Shard s = optimizer.shard();
      HostTensors host;
      host.add(model.backend(), "m", {s.count}, optimizer.first_moment());
      host.add(model.backend(), "v", {s.count}, optimizer.second_moment());
      write_safetensors((tmp_dir / moment_shard_file(rank, world)).string(), host.views,
                        {{"producer", "ptrain"}, {"begin", std::to_string(s.begin)}, {"count", std::to_string(s.count)}});
    });
  agree("their optimizer shards");

  if (main)
    attempt([&] {
      nlohmann::json j = state_to_json(state);
      const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"producer", "ptrain"}};
      if (master.empty()) {
        j["sha256"][kWeightsFile] = write_safetensors((tmp_dir / kWeightsFile).string(), weight_copies(model).views, metadata);
      } else {
        std::vector<SafetensorView> views;
        int64_t offset = 0;
        for (const ParamSpec& spec : model.specs()) {
          views.push_back({spec.name, spec.shape, master.data() + offset});
          offset += model.param(spec.id).numel();
        }
        j["sha256"][kWeightsFile] = write_safetensors((tmp_dir / kWeightsFile).string(), views, metadata);
      }
      if (optimizer.sharded()) {
        for (int r = 0; r < world; ++r) {
          const Shard s = shard_of(model.num_params(), r, world);
          const std::string file = moment_shard_file(r, world);
          j["optimizer_shards"].push_back({{"file", file}, {"begin", s.begin}, {"count", s.count}});
          j["sha256"][file] = SafetensorsFile::read((tmp_dir / file).string()).sha256();
        }
      } else {
        j["sha256"][kOptimizerFile] = write_safetensors((tmp_dir / kOptimizerFile).string(),
                                                        moment_copies(model, optimizer).views, {{"producer", "ptrain"}});
      }
      const std::string state_text = j.dump(2) + "\n";
      // What load_checkpoint would refuse is never written (the run plan bounds what can grow);
      // an error every rank hears of, so none waits for the others.
      if (static_cast<int64_t>(state_text.size()) > kMaxStateBytes)
        throw EnvironmentError("state.json would be " + std::to_string(state_text.size()) + " bytes, over the " +
                               std::to_string(kMaxStateBytes) + " load_checkpoint reads");
      OutputFile state_file((tmp_dir / kStateFile).string());
      state_file.write(state_text);
      state_file.finish(true);
      sync_directory(tmp_dir.string());
      if (before_publish) before_publish();
      fs::remove_all(final_dir, ec);  // a checkpoint of the same step from an earlier attempt
      rename_path(tmp_dir.string(), final_dir.string());
      sync_directory(root.string());
      write_file_atomic((root / kLatestFile).string(), final_dir.filename().string() + "\n");
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
  try {
    return load_verified(path);
  } catch (const NewerCheckpointFormat& e) {
    throw NewerCheckpointFormat("checkpoint \"" + path + "\" is not usable: " + e.what());
  } catch (const UserError& e) {
    throw UserError("checkpoint \"" + path + "\" is not usable: " + e.what());
  }
}

std::vector<std::string> checkpoints_after(const std::string& dir, int64_t step) {
  std::vector<std::string> later;
  for (const fs::path& p : checkpoint_dirs(dir))
    if (step_of(p.filename().string()) > step) later.push_back(p.string());
  return later;
}

std::string checkpoint_name(int64_t step) { return step_dir_name(step); }

void point_latest_at(const std::string& dir, int64_t step) {
  write_file_atomic((fs::path(dir) / kLatestFile).string(), step_dir_name(step) + "\n");
}

std::vector<std::string> set_aside_checkpoints(const std::vector<std::string>& checkpoints) {
  std::vector<std::string> moved;
  try {
    for (const std::string& p : checkpoints) {
      // A branch abandoned at the same step before keeps its name: the next free suffix.
      std::string aside = p + ".superseded";
      std::error_code ec;
      for (int n = 2; fs::exists(aside, ec) || fs::is_symlink(aside, ec); ++n)
        aside = p + ".superseded." + std::to_string(n);
      rename_path(p, aside);
      moved.push_back(aside);
    }
  } catch (...) {
    for (size_t i = 0; i < moved.size(); ++i) {
      std::error_code ec;
      fs::rename(moved[i], checkpoints[i], ec);  // best effort: the error that stopped us is the one to report
    }
    throw;
  }
  return moved;
}

std::optional<LoadedCheckpoint> find_latest_checkpoint(const std::string& dir,
                                                       const std::function<void(const std::string&)>& warn,
                                                       int64_t before_step) {
  for (const fs::path& candidate : checkpoint_dirs(dir)) {
    if (step_of(candidate.filename().string()) >= before_step) continue;
    try {
      return load_checkpoint(candidate.string());
    } catch (const NewerCheckpointFormat&) {
      throw;  // not damaged, only newer: skipping it would let this run overwrite it
    } catch (const UserError& e) {
      warn(std::string(e.what()) + "; trying the previous checkpoint");
    }
  }
  return std::nullopt;
}

bool holds_checkpoints(const std::string& dir) {
  std::error_code ec;
  return !checkpoint_dirs(dir).empty() || fs::exists(fs::path(dir) / kLatestFile, ec);
}

std::optional<std::string> checkpoint_dir_owner(const std::string& dir) {
  const std::string marker = (fs::path(dir) / kCheckpointOwnerFile).string();
  if (path_kind(marker, "checkpoint.dir") == PathKind::missing) return std::nullopt;
  std::string owner = InputFile(marker, "checkpoint.dir's owner file \"" + marker + "\"").read_all(1 << 16);
  while (!owner.empty() && owner.back() == '\n') owner.pop_back();
  return owner;
}

void claim_checkpoint_dir(const std::string& dir, const std::string& run_dir) {
  write_file_atomic((fs::path(dir) / kCheckpointOwnerFile).string(), fs::weakly_canonical(run_dir).string() + "\n");
}

void remove_checkpoints(const std::string& dir) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    const bool ours = name == kLatestFile || name == std::string(kLatestFile) + ".tmp" || step_of(name) >= 0 ||
                      (name.rfind("step_", 0) == 0 && name.size() > 13 && step_of(name.substr(0, 13)) >= 0) ||
                      (name.rfind(".step_", 0) == 0 && name.size() > 4 && name.substr(name.size() - 4) == ".tmp");
    if (!ours) continue;
    fs::remove_all(entry.path(), ec);
    if (ec) throw EnvironmentError("cannot remove \"" + entry.path().string() + "\": " + ec.message());
  }
}

void load_weights(const SafetensorsFile& weights, Transformer& model) {
  std::vector<float> host;
  for (const ParamSpec& spec : model.specs()) {
    host.resize(static_cast<size_t>(shape_numel(spec.shape)));
    weights.copy_to(spec.name, host.data(), static_cast<int64_t>(host.size()));
    model.load_weights(spec.id, host.data());
  }
  model.weights_loaded();
}

// Elements [begin, begin + count) of the flat moment vector `which` ("m" or "v"), from whichever
// layout the checkpoint has: per-tensor (optimizer.safetensors) or ZeRO-1 shards. So a run resumes
// at any world size and ZeRO stage, exactly.
std::vector<float> read_moments(const LoadedCheckpoint& checkpoint, const Transformer& model, const std::string& which,
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
    for (const ParamSpec& spec : model.specs()) {
      const int64_t n = model.param(spec.id).numel();
      take(offset, n, [&](float* dst) { checkpoint.optimizer->copy_to(which + "." + spec.name, dst, n); });
      offset += n;
    }
    return out;
  }
  for (const MomentShard& s : checkpoint.shards)
    take(s.begin, s.count, [&](float* dst) { s.file.copy_to(which, dst, s.count); });
  return out;
}

void restore_tensors(const LoadedCheckpoint& checkpoint, Transformer& model, AdamW& optimizer) {
  load_weights(checkpoint.weights, model);
  const Shard s = optimizer.shard();
  for (const auto& [which, moment] : {std::pair{"m", optimizer.first_moment()}, {"v", optimizer.second_moment()}})
    model.backend().upload(moment, read_moments(checkpoint, model, which, s.begin, s.count).data());
  optimizer.restore_steps(checkpoint.state.optimizer_steps);
}

}  // namespace ptrain
