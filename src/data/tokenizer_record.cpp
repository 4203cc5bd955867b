#include "data/tokenizer_record.h"

#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/input_file.h"
#include "core/json_input.h"
#include "core/output_file.h"
#include "core/paths.h"

namespace ptrain {

namespace fs = std::filesystem;

void write_tokenizer_record(const std::string& dir, const TokenizerRecord& r) {
  const nlohmann::json j = {{"format", "ptrain-tokenizer"},
                            {"version", 1},
                            {"tokenizer", r.tokenizer},
                            {"vocab_size", r.vocab_size},
                            {"end_of_text", r.end_of_text},
                            {"vocabulary_sha256", r.vocabulary_sha256}};
  write_file_atomic((fs::path(dir) / kTokenizerRecord).string(), j.dump(2) + "\n");
}

std::optional<TokenizerRecord> read_tokenizer_record(const std::string& dir) {
  const std::string path = (fs::path(dir) / kTokenizerRecord).string();
  const std::string what = "\"" + path + "\"";
  if (path_kind(path, kTokenizerRecord) == PathKind::missing) return std::nullopt;
  const nlohmann::json j = parse_json(InputFile(path, what).read_all(1 << 20), what);
  const auto bad = [&](const std::string& expected) {
    return UserError(what + " is malformed: expected " + expected + " (the record `ptrain data prepare` writes)");
  };
  if (!j.is_object() || !j.contains("format") || j["format"] != "ptrain-tokenizer") throw bad("\"format\": \"ptrain-tokenizer\"");
  if (!j.contains("version") || j["version"] != 1) throw bad("\"version\": 1");
  TokenizerRecord r;
  if (!j.contains("tokenizer") || !j["tokenizer"].is_string()) throw bad("\"tokenizer\": \"bytes\" or \"gpt2\"");
  r.tokenizer = j["tokenizer"].get<std::string>();
  if (r.tokenizer != "bytes" && r.tokenizer != "gpt2") throw bad("\"tokenizer\": \"bytes\" or \"gpt2\"");
  if (!j.contains("vocab_size") || !j["vocab_size"].is_number_integer() || j["vocab_size"] < 2 ||
      j["vocab_size"] > 65536)
    throw bad("\"vocab_size\": an integer in 2..65536");
  r.vocab_size = j["vocab_size"].get<int>();
  if (!j.contains("end_of_text") || !j["end_of_text"].is_number_integer() || j["end_of_text"] < -1 ||
      j["end_of_text"] >= r.vocab_size)
    throw bad("\"end_of_text\": -1 or a token id below vocab_size");
  r.end_of_text = j["end_of_text"].get<int>();
  if (!j.contains("vocabulary_sha256") || !j["vocabulary_sha256"].is_string()) throw bad("\"vocabulary_sha256\": a string");
  r.vocabulary_sha256 = j["vocabulary_sha256"].get<std::string>();
  return r;
}

}  // namespace ptrain
