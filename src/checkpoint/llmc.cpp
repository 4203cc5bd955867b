#include "checkpoint/llmc.h"

#include <cmath>

#include "core/error.h"
#include "core/input_file.h"
#include "core/output_file.h"
#include "model/param_layout.h"
#include "precision/formats.h"

namespace ptrain {
namespace {

constexpr int kHeaderInts = 256;

ModelShape shape_of(const LlmcModel& m) {
  return ModelShape{m.n_layer, m.n_head, m.n_embd, m.max_seq_len, m.vocab_size, m.padded_vocab};
}

}  // namespace

LlmcModel read_llmc(const std::string& path, const std::string& what) {
  const InputFile in(path, what + " \"" + path + "\"");
  const int64_t size = in.size();
  auto bad = [&](const std::string& why) {
    return UserError(what + " \"" + path + "\" is not a usable llm.c model file: " + why);
  };
  int32_t header[kHeaderInts];
  if (size < static_cast<int64_t>(sizeof header)) throw bad("shorter than the 1024-byte header");
  in.read_at(0, header, sizeof header);
  if (header[0] != kLlmcMagic)
    throw bad("it does not begin with llm.c's magic number " + std::to_string(kLlmcMagic));
  LlmcModel m;
  m.version = header[1];
  if (m.version != 3 && m.version != 5)
    throw bad("version " + std::to_string(m.version) + ", expected 3 (fp32) or 5 (bf16)");
  m.max_seq_len = header[2];
  m.vocab_size = header[3];
  m.n_layer = header[4];
  m.n_head = header[5];
  m.n_embd = header[6];
  m.padded_vocab = header[7];
  // The same bounds as a config's, before any size is computed from them.
  if (m.max_seq_len < 1 || m.max_seq_len > kMaxSeqLen || m.vocab_size < 2 || m.vocab_size > kMaxVocab || m.n_layer < 1 ||
      m.n_layer > kMaxLayers || m.n_embd < 1 || m.n_embd > kMaxEmbd || m.n_head < 1 || m.n_embd % m.n_head != 0 ||
      m.padded_vocab < m.vocab_size || m.padded_vocab > kMaxVocab + 128)
    throw bad("inconsistent header (max_seq_len " + std::to_string(m.max_seq_len) + ", vocab_size " +
              std::to_string(m.vocab_size) + ", n_layer " + std::to_string(m.n_layer) + ", n_head " +
              std::to_string(m.n_head) + ", n_embd " + std::to_string(m.n_embd) + ", padded_vocab_size " +
              std::to_string(m.padded_vocab) + ")");
  const int64_t count = param_count(shape_of(m));
  const int64_t elem = m.version == 3 ? 4 : 2;
  if (size != static_cast<int64_t>(sizeof header) + count * elem)
    throw bad("file size " + std::to_string(size) + " bytes, expected " +
              std::to_string(sizeof header + count * elem) + " for the header's shape");
  m.params.resize(static_cast<size_t>(count));
  if (m.version == 3) {
    in.read_at(sizeof header, m.params.data(), static_cast<size_t>(count) * 4);
  } else {
    std::vector<uint16_t> bits(static_cast<size_t>(count));
    in.read_at(sizeof header, bits.data(), static_cast<size_t>(count) * 2);
    for (int64_t i = 0; i < count; ++i) m.params[i] = bf16_value(bits[i]);
  }
  for (int64_t i = 0; i < count; ++i)
    if (!std::isfinite(m.params[i]))
      throw bad("parameter " + std::to_string(i) + " is a NaN or infinity; a model to train from must hold finite values");
  return m;
}

std::vector<std::string> llmc_mismatches(const LlmcModel& file, const ModelConfig& model) {
  std::vector<std::string> out;
  auto check = [&](const char* field, int in_file, const char* key, int in_config) {
    if (in_file != in_config)
      out.push_back(std::string(field) + " " + std::to_string(in_file) + " in the file vs " + std::to_string(in_config) +
                    " in " + key);
  };
  check("max_seq_len", file.max_seq_len, "model.seq_len", model.seq_len);
  check("vocab_size", file.vocab_size, "model.vocab_size", model.vocab_size);
  check("n_layer", file.n_layer, "model.n_layer", model.n_layer);
  check("n_head", file.n_head, "model.n_head", model.n_head);
  check("n_embd", file.n_embd, "model.n_embd", model.n_embd);
  check("padded_vocab_size", file.padded_vocab, "the padded model.vocab_size", model.padded_vocab());
  return out;
}

bool is_llmc_model_file(const std::string& path) {
  try {
    const InputFile in(path, "\"" + path + "\"");
    int32_t head[2];
    if (in.size() < kHeaderInts * 4) return false;
    in.read_at(0, head, sizeof head);
    return head[0] == kLlmcMagic && (head[1] == 3 || head[1] == 5);
  } catch (const UserError&) {
    return false;
  }
}

void write_llmc(const std::string& path, const LlmcModel& m) {
  int32_t header[kHeaderInts] = {};
  header[0] = kLlmcMagic;
  header[1] = m.version;
  header[2] = m.max_seq_len;
  header[3] = m.vocab_size;
  header[4] = m.n_layer;
  header[5] = m.n_head;
  header[6] = m.n_embd;
  header[7] = m.padded_vocab;
  // Written under a temporary name, synced, then renamed: a failed export never leaves a
  // half-written model file under the name asked for.
  AtomicFile out(path);
  out.write(header, sizeof header);
  if (m.version == 3) {
    out.write(m.params.data(), m.params.size() * 4);
  } else {
    std::vector<uint16_t> bits(m.params.size());
    for (size_t i = 0; i < bits.size(); ++i) bits[i] = bf16_bits(m.params[i]);
    out.write(bits.data(), bits.size() * 2);
  }
  out.commit();
}

}  // namespace ptrain
