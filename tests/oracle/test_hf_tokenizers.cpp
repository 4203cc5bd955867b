// The tokenizer.json files ptrain's Hugging Face exports write, loaded by Hugging Face's own
// tokenizers (its Rust library's node binding, Tokenizer.fromFile): GPT-2's gives ptrain's ids
// (tiktoken's) on random text of the contexts GPT-2's pattern tells apart and on real speeches,
// and the bytes tokenizer's gives each byte of the UTF-8 text as its id; both decode those ids
// back to the text. Then the same through `ptrain export` itself (and `data hf-tokenizer`, which
// writes the same file), for every tokenizer (cl100k_base's and o200k_base's tokenizer.json
// written from their ranks, Llama 3's the file itself).
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/paths.h"
#include "data/hf_tokenizer_files.h"
#include "data/tokenizer.h"
#include "gpt2_ids.h"
#include "oracle_texts.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace ptrain;
using namespace ptrain::test;

namespace {

// What hf_tokenizers.js `mode` says of each string under `tokenizer_json`.
nlohmann::json run_oracle(const std::string& mode, const fs::path& tokenizer_json,
                          const std::vector<std::string>& strings, const fs::path& dir) {
  write_file(dir / "in.json", nlohmann::json(strings).dump());
  ptrain::test::run_node("hf_tokenizers.js", mode + " '" + tokenizer_json.string() + "' '" + (dir / "in.json").string() +
                                                 "' '" + (dir / "out.json").string() + "'");
  return nlohmann::json::parse(read_file(dir / "out.json"));
}

// Hugging Face's ids for each string.
std::vector<std::vector<int32_t>> hf_ids(const fs::path& tokenizer_json, const std::vector<std::string>& strings,
                                         const fs::path& dir) {
  return run_oracle("strings", tokenizer_json, strings, dir).get<std::vector<std::vector<int32_t>>>();
}

// How many strings Hugging Face's decode does not give back from their ids.
size_t lost_in_decoding(const fs::path& tokenizer_json, const std::vector<std::string>& strings, const fs::path& dir) {
  const std::vector<bool> same = run_oracle("roundtrip", tokenizer_json, strings, dir).get<std::vector<bool>>();
  REQUIRE(same.size() == strings.size());
  return static_cast<size_t>(std::count(same.begin(), same.end(), false));
}

std::vector<int32_t> byte_ids(const std::string& text) {
  std::vector<int32_t> ids;
  for (const char c : text) ids.push_back(static_cast<unsigned char>(c));
  return ids;
}

// Random strings over the characters GPT-2's pattern tells apart: letters, contractions, digits,
// spaces, line breaks, other whitespace, punctuation, combining marks, CJK, emoji. Without the
// literal "<|endoftext|>", which tokenizer.json makes the special token (as GPT-2's own file
// does) where `data prepare` encodes text as tiktoken's encode_ordinary.
std::vector<std::string> random_text(unsigned seed, int count) {
  std::mt19937 rng(seed);
  const std::vector<std::string> alphabet = {"a", "Z", "s", "t", "l", "e", "'", "\xE2\x80\x99", " ", " ", "  ", "\n",
                                             "\r\n", "\t", "\xC2\xA0", "\xE3\x80\x80", "\xC2\x85", "\x0B", "9", "0",
                                             "\xD9\xA3", "\xC2\xBD", ".", "!", "?", "-", "_", "\xC3\xA9",
                                             "\xCC\x81", "\xE4\xB8\xAD", "\xF0\x9F\x98\x80", "\xE2\x80\x8D",
                                             "\xEF\xBB\xBF", "\xE1\xA0\x8E", "<|", "|>", "end"};
  std::vector<std::string> out;
  for (int i = 0; i < count; ++i) {
    std::string s;
    for (int n = 1 + static_cast<int>(rng() % 60); n > 0; --n) s += alphabet[rng() % alphabet.size()];
    out.push_back(s);
  }
  return out;
}

// The last `n` State of the Union addresses, whole.
std::vector<std::string> speeches(size_t n) {
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(fs::path(data_cache_dir()) / "text/sotu")) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  REQUIRE(files.size() >= n);
  std::vector<std::string> texts;
  for (size_t i = files.size() - n; i < files.size(); ++i) texts.push_back(read_file(files[i]));
  return texts;
}

// Compares ids string by string; reports the first few that differ.
void expect_same(const std::vector<std::string>& strings, const std::vector<std::vector<int32_t>>& theirs,
                 const std::function<std::vector<int32_t>(const std::string&)>& ours) {
  REQUIRE(theirs.size() == strings.size());
  int differ = 0;
  for (size_t i = 0; i < strings.size(); ++i)
    if (ours(strings[i]) != theirs[i] && ++differ <= 5) UNSCOPED_INFO("differs on " << nlohmann::json(strings[i]).dump());
  CHECK(differ == 0);
}

}  // namespace

TEST_CASE("tokenizers oracle: GPT-2's tokenizer.json encodes as ptrain does, on random text and speeches",
          "[oracle]") {
  TempDir dir("hf-oracle");
  const BpeVocabulary& v = *gpt2().bpe();
  write_file(dir.dir / "tokenizer.json",
             gpt2_tokenizer_json(bpe_vocab_json(v), bpe_merges_txt(v), gpt2().end_of_text()));
  std::vector<std::string> strings = random_text(4242, 3000);
  for (const std::string& speech : speeches(10)) strings.push_back(speech);
  expect_same(strings, hf_ids(dir.dir / "tokenizer.json", strings, dir.dir), gpt2_ids);
  CHECK(lost_in_decoding(dir.dir / "tokenizer.json", strings, dir.dir) == 0);
  // And the special token, which tokenizer.json knows by name.
  CHECK(hf_ids(dir.dir / "tokenizer.json", {"a<|endoftext|>b"}, dir.dir)[0] ==
        std::vector<int32_t>{gpt2_ids("a")[0], 50256, gpt2_ids("b")[0]});
}

TEST_CASE("tokenizers oracle: the bytes tokenizer's tokenizer.json gives each byte its id", "[oracle]") {
  TempDir dir("hf-oracle");
  write_file(dir.dir / "tokenizer.json", bytes_tokenizer_json());
  std::vector<std::string> strings = random_text(77, 500);
  strings.push_back(speeches(1)[0]);
  expect_same(strings, hf_ids(dir.dir / "tokenizer.json", strings, dir.dir), byte_ids);
  CHECK(lost_in_decoding(dir.dir / "tokenizer.json", strings, dir.dir) == 0);
}

TEST_CASE("tokenizers oracle: ptrain export writes a tokenizer.json that Hugging Face loads, for each tokenizer",
          "[oracle]") {
  TempDir dir("hf-oracle");
  const std::string text = speeches(2)[0];
  write_file(dir.dir / "corpus.txt", text);
  for (const std::string tokenizer : {"gpt2", "bytes", "cl100k_base", "o200k_base", "llama3"}) {
    CAPTURE(tokenizer);
    const std::string vocab = std::to_string(tokenizer_ids(tokenizer));
    REQUIRE(ptrain::test::run_ptrain("data prepare --input corpus.txt --out " + tokenizer + " --tokenizer " + tokenizer,
                                     dir.dir)
                .exit_code == 0);
    write_file(dir.dir / "run.yaml",
               "run: {name: " + tokenizer + ", out_dir: runs}\n"
               "model: {n_layer: 1, n_head: 2, n_embd: 16, seq_len: 16, vocab_size: " + vocab + "}\n"
               "data: {train: \"" + tokenizer + "/" + tokenizer + "_train_*.bin\", val: \"" + tokenizer + "/" +
               tokenizer + "_val_*.bin\"}\n"
               "training: {steps: 1, batch_tokens: 64, micro_batch: 4, eval_every: 0, eval_batches: 1}\n");
    const ptrain::test::CommandResult trained = ptrain::test::run_ptrain("train run.yaml", dir.dir);
    INFO(trained.output);
    REQUIRE(trained.exit_code == 0);
    const ptrain::test::CommandResult exported = ptrain::test::run_ptrain(
        "export --format hf --checkpoint runs/" + tokenizer + "/checkpoints/step_00000001 --out hf-" + tokenizer,
        dir.dir);
    INFO(exported.output);
    REQUIRE(exported.exit_code == 0);
    for (const char* file : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"})
      CHECK(fs::is_regular_file(dir.dir / ("hf-" + tokenizer) / file));
    // `data hf-tokenizer` writes the same tokenizer.json without a model.
    REQUIRE(ptrain::test::run_ptrain("data hf-tokenizer --tokenizer " + tokenizer + " --out tok-" + tokenizer, dir.dir)
                .exit_code == 0);
    CHECK(read_file(dir.dir / ("tok-" + tokenizer) / "tokenizer.json") ==
          read_file(dir.dir / ("hf-" + tokenizer) / "tokenizer.json"));
    std::vector<std::string> strings = random_text(4243, 300);
    strings.push_back(text.substr(0, 4000));
    const Tokenizer ours = Tokenizer::load(tokenizer);
    expect_same(strings, hf_ids(dir.dir / ("hf-" + tokenizer) / "tokenizer.json", strings, dir.dir),
                [&](const std::string& s) {
                  const std::vector<uint32_t> ids = ours.encode(s, "text");
                  return std::vector<int32_t>(ids.begin(), ids.end());
                });
    CHECK(lost_in_decoding(dir.dir / ("hf-" + tokenizer) / "tokenizer.json", strings, dir.dir) == 0);
  }
}
