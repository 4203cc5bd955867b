#include "checkpoint/hf_directory.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <set>

#include "core/error.h"
#include "core/input_file.h"
#include "core/json_input.h"
#include "core/output_file.h"
#include "core/paths.h"
#include "core/tensor.h"
#include "precision/formats.h"

namespace fs = std::filesystem;

namespace ptrain {
namespace {

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

std::string quoted(const fs::path& p) { return "\"" + p.string() + "\""; }

// The tensor's values in the exported dtype, as little-endian bytes.
std::string encode(const std::vector<float>& values, StDtype dtype, const std::string& name) {
  std::string bytes(values.size() * st_dtype_bytes(dtype), '\0');
  if (dtype == StDtype::f32) {
    std::memcpy(bytes.data(), values.data(), bytes.size());
    return bytes;
  }
  for (size_t i = 0; i < values.size(); ++i) {
    const uint16_t bits = dtype == StDtype::bf16 ? bf16_bits(values[i]) : fp16_bits(values[i]);
    const float back = dtype == StDtype::bf16 ? bf16_value(bits) : fp16_value(bits);
    if (!std::isfinite(back))
      throw UserError("--dtype " + std::string(dtype == StDtype::bf16 ? "bf16" : "fp16") + ": tensor " + name +
                      " holds " + std::to_string(values[i]) + " at index " + std::to_string(i) +
                      ", beyond the format's range; expected --dtype fp32 or bf16");
    std::memcpy(bytes.data() + 2 * i, &bits, 2);
  }
  return bytes;
}

void write_text(const fs::path& path, const std::string& text) {
  OutputFile out(path.string());
  out.write(text);
  out.finish(true);
}

// --out as one absolute path, without the trailing separator of "dir/" (or the "." of "dir/.").
fs::path resolved(const std::string& out) {
  fs::path p = fs::absolute(out).lexically_normal();
  while (p.filename().empty() && p.has_parent_path() && p != p.parent_path()) p = p.parent_path();
  return p;
}

}  // namespace

int64_t parse_shard_size(const std::string& text, const std::string& what) {
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  const std::string unit = text.substr(digits);
  int64_t scale = 0;
  if (unit.empty() || unit == "B") scale = 1;
  else if (unit == "KB") scale = 1000;
  else if (unit == "MB") scale = 1000 * 1000;
  else if (unit == "GB") scale = 1000 * 1000 * 1000;
  // At most 12 digits, and at most 1000 GB: no product overflows.
  const int64_t value = digits == 0 || digits > 12 ? 0 : std::stoll(text.substr(0, digits));
  if (value == 0 || scale == 0 || value > 1'000'000'000'000 / scale)
    throw UserError(what + ": \"" + text + "\"; expected a positive size up to 1000GB such as 5GB, 200MB, 64KB or a "
                    "byte count");
  return value * scale;
}

std::vector<std::string> write_hf_directory(const std::string& out, const HfDirectoryContents& c) {
  // Every tensor encoded first: a value fp16 cannot hold is refused before a byte is written.
  std::vector<std::string> data;
  int64_t total = 0;
  for (const HfTensorSpec& spec : c.specs) {
    data.push_back(encode(hf_values(spec, c.flat), c.dtype, spec.name));
    total += static_cast<int64_t>(data.back().size());
  }
  // save_pretrained's split: tensors in order, a new shard when the next would overflow this one.
  std::vector<std::vector<size_t>> shards(c.specs.empty() ? 0 : 1);  // text files only without specs
  int64_t in_shard = 0;
  for (size_t i = 0; i < data.size(); ++i) {
    const int64_t bytes = static_cast<int64_t>(data[i].size());
    if (!shards.back().empty() && in_shard + bytes > c.max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(i);
    in_shard += bytes;
  }
  std::vector<std::string> names;
  char buf[64];
  for (size_t k = 0; k < shards.size(); ++k) {
    std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", k + 1, shards.size());
    names.push_back(shards.size() == 1 ? kSingleFile : buf);
  }

  const fs::path target = resolved(out);
  const fs::path tmp = target.parent_path() / ("." + target.filename().string() + ".ptrain-export-tmp");
  const fs::path old = target.parent_path() / ("." + target.filename().string() + ".ptrain-export-old");
  std::error_code ec;
  fs::remove_all(tmp, ec);  // a crashed export's leftovers
  if (!fs::create_directories(tmp, ec))
    throw EnvironmentError("cannot create " + quoted(tmp) + ": " + ec.message());
  bool moved_aside = false;
  try {
    nlohmann::ordered_json index;
    index["metadata"] = {{"total_size", total}};
    index["weight_map"] = nlohmann::ordered_json::object();
    for (size_t k = 0; k < shards.size(); ++k) {
      std::vector<SafetensorView> views;
      for (size_t i : shards[k]) {
        views.push_back({c.specs[i].name, c.specs[i].shape(), data[i].data(), c.dtype});
        index["weight_map"][c.specs[i].name] = names[k];
      }
      write_safetensors((tmp / names[k]).string(), views, {{"format", "pt"}});
    }
    if (shards.size() > 1) write_text(tmp / kIndexFile, index.dump(2) + "\n");
    for (const auto& [name, text] : c.text_files) write_text(tmp / name, text);
    sync_directory(tmp.string());
    const bool replacing = fs::exists(target, ec);
    if (replacing) {
      fs::remove_all(old, ec);
      rename_path(target.string(), old.string());
      moved_aside = true;
    }
    rename_path(tmp.string(), target.string());
    moved_aside = false;
    sync_directory(target.parent_path().string());
    if (replacing) fs::remove_all(old, ec);
  } catch (...) {
    fs::remove_all(tmp, ec);
    if (moved_aside) fs::rename(old, target, ec);  // the earlier export back where it was
    throw;
  }
  return names;
}

HfWeights read_hf_directory(const std::string& dir, const ModelConfig& model, const std::string& what) {
  const fs::path root(dir);
  const std::string where = what + " \"" + dir + "\"";
  const fs::path config_path = root / "config.json";
  if (path_kind(config_path.string(), what) != PathKind::file)
    throw UserError(where + " has no config.json; expected a Hugging Face model directory (config.json and "
                    "model.safetensors)");
  check_link_stays_inside(dir, "config.json", what);
  const nlohmann::json config =
      parse_json(InputFile(config_path.string(), quoted(config_path)).read_all(16 << 20), what + " " + quoted(config_path));
  const HfConfigCheck check = check_hf_config(config, model);
  if (!check.problems.empty()) {
    std::vector<std::string> problems;
    for (const auto& p : check.problems) problems.push_back(what + " " + quoted(config_path) + ": " + p);
    throw UserErrors(problems);
  }

  HfWeights out;
  out.ignored = check.ignored;
  // The index, when there is one, is one truth about where each tensor lives: a tensor in
  // another file than it names, or named but in no file, is refused, not looked for.
  std::map<std::string, std::string> index_file_of;
  // config.json's torch_dtype, when set, is what the tensors hold: a file labelled otherwise
  // would be read as other numbers (BF16 bits taken for F16).
  std::optional<StDtype> labelled;
  if (config.is_object() && config.contains("torch_dtype") && config["torch_dtype"].is_string()) {
    const std::string t = config["torch_dtype"].get<std::string>();
    if (t == "float32") labelled = StDtype::f32;
    else if (t == "bfloat16") labelled = StDtype::bf16;
    else if (t == "float16") labelled = StDtype::f16;
  }
  const fs::path index_path = root / kIndexFile;
  if (path_kind(index_path.string(), what) == PathKind::file) {
    check_link_stays_inside(dir, kIndexFile, what);
    const nlohmann::json index = parse_json(InputFile(index_path.string(), quoted(index_path)).read_all(64 << 20),
                                            what + " " + quoted(index_path));
    const nlohmann::json map = index.is_object() ? index.value("weight_map", nlohmann::json()) : nlohmann::json();
    if (!map.is_object() || map.empty())
      throw UserError(what + " " + quoted(index_path) + " has no weight_map object naming each tensor's file");
    std::set<std::string> files;
    for (const auto& [tensor, file] : map.items()) {
      const std::string name = file.is_string() ? file.get<std::string>() : "";
      if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
        throw UserError(what + " " + quoted(index_path) + ": tensor " + tensor + " maps to " + file.dump() +
                        "; expected a file name in the directory");
      files.insert(name);
      index_file_of[tensor] = name;
    }
    out.files.assign(files.begin(), files.end());
  } else if (path_kind((root / kSingleFile).string(), what) == PathKind::file) {
    out.files = {kSingleFile};
  } else {
    throw UserError(where + " has neither " + kSingleFile + " nor " + kIndexFile + "; expected the model's weights");
  }

  std::vector<HfTensorSpec> specs = hf_tensor_specs(model);
  std::map<std::string, const HfTensorSpec*> expected;
  for (const auto& s : specs) expected[s.name] = &s;
  const bool gpt2 = model.arch != Arch::llama;
  const ModelShape shape = ModelShape::of(model);
  out.params.assign(static_cast<size_t>(param_count(shape)), 0.0f);
  std::set<std::string> found;
  std::vector<float> tied_head;  // GPT-2 files that keep lm_head.weight beside wte
  std::string tied_head_file;
  std::vector<std::string> problems;
  for (const std::string& file : out.files) {
    const fs::path path = root / file;
    check_link_stays_inside(dir, file, what);
    const SafetensorsFile st = SafetensorsFile::read(path.string(), /*any_float=*/true);
    for (const std::string& stored : st.names()) {
      if (!index_file_of.empty()) {
        const auto named = index_file_of.find(stored);
        if (named == index_file_of.end()) {
          problems.push_back(what + " " + quoted(path) + ": tensor " + stored + " is not in " + kIndexFile +
                             "'s weight_map; expected the index to name every tensor");
          continue;
        }
        if (named->second != file) {
          problems.push_back(what + " " + quoted(path) + ": tensor " + stored + " is here, but " + kIndexFile +
                             " names " + named->second + "; expected each tensor in the file its index names");
          continue;
        }
        index_file_of.erase(named);
      }
      // HF's own gpt2 files name the tensors without "transformer."; GPT2LMHeadModel's with it.
      const bool bare = gpt2 && stored.rfind("transformer.", 0) != 0 && stored != "lm_head.weight";
      const std::string name = bare ? "transformer." + stored : stored;
      const auto ends_with = [&](const std::string& tail) {
        return name.size() >= tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
      };
      const int64_t count = shape_numel(st.shape(stored));
      if (gpt2 && (ends_with(".attn.bias") || ends_with(".attn.masked_bias"))) {
        out.skipped.push_back(stored);  // causal-mask buffers of older transformers, not weights
        continue;
      }
      if (labelled && st.dtype(stored) != *labelled) {
        problems.push_back(what + " " + quoted(path) + ": tensor " + stored + " is labelled " +
                           st_dtype_name(st.dtype(stored)) + ", but config.json's torch_dtype is " +
                           config["torch_dtype"].get<std::string>() + "; expected the dtype config.json names");
        continue;
      }
      if (gpt2 && name == "lm_head.weight") {
        tied_head.resize(static_cast<size_t>(count));
        st.copy_to(stored, tied_head.data(), count);
        tied_head_file = path.string();
        continue;
      }
      const auto it = expected.find(name);
      if (it == expected.end()) {
        problems.push_back(what + " " + quoted(path) + ": unexpected tensor " + stored + " (not part of a " + choice_name(model.arch) +
                           " model of this shape)");
        continue;
      }
      if (!found.insert(name).second) {
        problems.push_back(what + " " + quoted(path) + ": tensor " + stored + " appears twice");
        continue;
      }
      const HfTensorSpec& spec = *it->second;
      if (st.shape(stored) != spec.shape()) {
        std::string got, want;
        for (int64_t d : st.shape(stored)) got += (got.empty() ? "" : ", ") + std::to_string(d);
        for (int64_t d : spec.shape()) want += (want.empty() ? "" : ", ") + std::to_string(d);
        problems.push_back(what + " " + quoted(path) + ": tensor " + stored + " has shape [" + got + "]; expected [" +
                           want + "]");
        continue;
      }
      std::vector<float> values(static_cast<size_t>(count));
      st.copy_to(stored, values.data(), count);
      for (int64_t i = 0; i < count; ++i)
        if (!std::isfinite(values[i])) {
          problems.push_back(what + " " + quoted(path) + ": tensor " + stored + " holds a NaN or infinity at index " +
                             std::to_string(i));
          break;
        }
      put_hf_values(spec, values.data(), out.params.data());
    }
  }
  for (const auto& [tensor, file] : index_file_of)
    problems.push_back(what + " " + quoted(index_path) + ": weight_map puts tensor " + tensor + " in " + file +
                       ", which does not hold it; expected each named tensor in its file");
  for (const auto& s : specs)
    if (!found.count(s.name)) problems.push_back(where + ": tensor " + s.name + " is missing");
  if (!problems.empty()) throw UserErrors(problems);
  if (!tied_head.empty()) {
    const std::vector<float> wte = hf_values(specs.front(), out.params.data());
    if (tied_head != wte)
      throw UserError(what + " \"" + tied_head_file + "\": lm_head.weight differs from transformer.wte.weight; "
                      "ptrain's GPT-2 ties them (expected the same values, or no lm_head.weight)");
  }
  return out;
}

}  // namespace ptrain
