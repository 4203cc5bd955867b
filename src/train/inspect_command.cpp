#include "train/inspect_command.h"

#include <cstdio>
#include <filesystem>
#include <limits>

#include "checkpoint/checkpoint.h"
#include "checkpoint/llmc.h"
#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "core/input_file.h"
#include "core/json_input.h"
#include "core/paths.h"
#include "core/sha256.h"

namespace fs = std::filesystem;

namespace ptrain {

namespace {

void print_tensors(const SafetensorsFile& st, const char* indent) {
  for (const auto& name : st.names()) {
    std::string shape;
    for (int64_t d : st.shape(name)) shape += (shape.empty() ? "" : ",") + std::to_string(d);
    std::printf("%s%-16s F32 (%s)\n", indent, name.c_str(), shape.c_str());
  }
}

// A checkpoint directory: what state.json says and each file's checksum, then the complete
// verification resume makes; an invalid checkpoint is an error (exit 2) saying why.
void inspect_checkpoint(const fs::path& p) {
  const std::string path = p.string();
  if (path_kind((p / "state.json").string(), "inspect") == PathKind::missing)
    throw UserError("\"" + path + "\" is a directory without state.json: not a checkpoint, or an incomplete save "
                    "(NOT valid: resume would skip it)");
  const std::string state_path = (p / "state.json").string();
  const nlohmann::json state = parse_json(InputFile(state_path, "\"" + state_path + "\"").read_all(64 << 20), "\"" + state_path + "\"");
  if (!state.is_object() || !state.value("sha256", nlohmann::json::object()).is_object())
    throw UserError("\"" + path + "/state.json\" is not a ptrain checkpoint state");
  std::printf("checkpoint %s\n  step %s, tokens %s, precision %s\n  model %s\n", path.c_str(),
              state.value("step", nlohmann::json()).dump().c_str(), state.value("tokens", nlohmann::json()).dump().c_str(),
              state.value("precision", nlohmann::json()).dump().c_str(), state.value("model", nlohmann::json()).dump().c_str());
  // Checkpoints from before model.arch are GPT-2's.
  const nlohmann::json model = state.value("model", nlohmann::json::object());
  const nlohmann::json arch = model.is_object() ? model.value("arch", nlohmann::json("gpt2")) : nlohmann::json();
  std::printf("  architecture %s\n", arch.is_string() ? arch.get<std::string>().c_str() : arch.dump().c_str());
  if (state.contains("tokenizer"))
    std::printf("  tokenizer %s, vocabulary SHA-256 %s\n", state["tokenizer"].dump().c_str(),
                state.value("vocabulary_sha256", nlohmann::json()).dump().c_str());
  if (state.contains("loss_scaler")) std::printf("  loss scaler %s\n", state["loss_scaler"].dump().c_str());
  if (state.contains("fp8")) std::printf("  fp8 tensors with scaling state: %zu\n", state["fp8"].size());
  for (const auto& [file, expected] : state["sha256"].items()) {
    const fs::path f = p / file;
    const bool plain_name = file.find('/') == std::string::npos && file != ".." && file != ".";
    if (!plain_name || path_kind(f.string(), "inspect") == PathKind::missing) {
      std::printf("  %-22s MISSING\n", file.c_str());
      continue;
    }
    try {
      std::string bytes = InputFile(f.string(), "\"" + f.string() + "\"").read_all(std::numeric_limits<int64_t>::max());
      const bool valid = expected.is_string() && sha256_hex(bytes.data(), bytes.size()) == expected.get<std::string>();
      std::printf("  %-22s %s\n", file.c_str(), valid ? "sha256 ok" : "sha256 MISMATCH");
      if (valid) print_tensors(SafetensorsFile(std::move(bytes), "\"" + f.string() + "\""), "    ");
    } catch (const UserError& e) {
      std::printf("  %-22s unreadable: %s\n", file.c_str(), e.what());
    }
  }
  std::fflush(stdout);
  try {
    load_checkpoint(path);
  } catch (const UserError& e) {
    throw UserError(std::string(e.what()) + " (NOT valid: resume would skip this checkpoint)");
  }
  std::printf("  valid\n");
}

}  // namespace

void inspect(const std::string& path) {
  const PathKind kind = path_kind(path, "inspect");
  if (kind == PathKind::missing) throw UserError("inspect: \"" + path + "\" does not exist; expected a checkpoint "
                                                 "directory, a .safetensors file or an llm.c model file");
  if (kind == PathKind::directory) return inspect_checkpoint(path);
  if (fs::path(path).extension() == ".safetensors") {
    const SafetensorsFile st = SafetensorsFile::read(path);
    std::printf("safetensors %s\n", path.c_str());
    print_tensors(st, "  ");
    return;
  }
  const LlmcModel m = read_llmc(path, "inspect:");
  std::printf("llm.c model file %s\n  version %d (%s), max_seq_len %d, vocab_size %d (padded %d), n_layer %d, n_head %d, "
              "n_embd %d\n  %zu parameters\n",
              path.c_str(), m.version, m.version == 3 ? "fp32" : "bf16", m.max_seq_len, m.vocab_size, m.padded_vocab,
              m.n_layer, m.n_head, m.n_embd, m.params.size());
}

}  // namespace ptrain
