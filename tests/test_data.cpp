// Token shards, the token stream and its samplers, the synthetic Markov corpus and byte-level
// text preparation.
#include <catch2/catch.hpp>

#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/blend.h"
#include "data/dataset.h"
#include "data/shard.h"
#include "data/synthetic.h"
#include "user_error.h"

namespace fs = std::filesystem;
using namespace ptrain;

namespace {

// A fresh directory under /tmp, removed with everything in it when the test ends.
struct TempDir {
  fs::path path;
  TempDir() {
    char name[] = "/tmp/ptrain_data_XXXXXX";
    REQUIRE(mkdtemp(name) != nullptr);
    path = name;
  }
  ~TempDir() { fs::remove_all(path); }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

using ptrain::test::user_error;

// A shard file with an arbitrary header and `token_bytes` zero bytes after it.
void write_raw_shard(const std::string& path, int32_t magic, int32_t version, int32_t count,
                     size_t token_bytes) {
  std::vector<int32_t> header(kShardHeaderInts, 0);
  header[0] = magic;
  header[1] = version;
  header[2] = count;
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(header.data()), header.size() * sizeof(int32_t));
  out << std::string(token_bytes, '\0');
}

std::vector<uint32_t> read_tokens(const std::string& path) {
  TokenShard shard(path);
  std::vector<uint32_t> tokens(static_cast<size_t>(shard.size()));
  shard.read(0, shard.size(), tokens.data());
  return tokens;
}

std::vector<uint16_t> iota_tokens(int64_t begin, int64_t n) {
  std::vector<uint16_t> tokens;
  for (int64_t i = 0; i < n; ++i) tokens.push_back(static_cast<uint16_t>(begin + i));
  return tokens;
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

TEST_CASE("a shard round-trips through write_shard and TokenShard", "[data]") {
  TempDir dir;
  const std::string path = dir / "train_000000.bin";
  const std::vector<uint16_t> tokens = {0, 1, 2, 255, 256, 1000, 65535};
  write_shard(path, tokens);

  CHECK_FALSE(fs::exists(path + ".tmp"));
  CHECK(fs::file_size(path) == 1024 + 2 * tokens.size());
  const std::string bytes = file_bytes(path);
  std::vector<int32_t> header(kShardHeaderInts);
  std::memcpy(header.data(), bytes.data(), 1024);
  CHECK(header[0] == 20240520);
  CHECK(header[1] == 1);
  CHECK(header[2] == static_cast<int32_t>(tokens.size()));
  for (int i = 3; i < kShardHeaderInts; ++i) CHECK(header[i] == 0);

  TokenShard shard(path);
  CHECK(shard.path() == path);
  CHECK(&shard.format() == &kUint16Shards);
  CHECK(read_tokens(path) == std::vector<uint32_t>(tokens.begin(), tokens.end()));

  TokenShard moved(std::move(shard));
  CHECK(moved.size() == static_cast<int64_t>(tokens.size()));
  uint32_t last = 0;
  moved.read(6, 1, &last);
  CHECK(last == 65535);
}

TEST_CASE("uint32 shards are llm.c's Llama 3 format and hold ids past 65,535", "[data]") {
  TempDir dir;
  const std::string path = dir / "train_000000.bin";
  // Llama 3's vocabulary ends at 128,255; the ids below cross each byte of a uint32.
  const std::vector<uint32_t> tokens = {0, 65535, 65536, 128000, 128255, 16777215, 16777216, 1000};
  write_shard(path, tokens);

  CHECK(fs::file_size(path) == 1024 + 4 * tokens.size());
  const std::string bytes = file_bytes(path);
  std::vector<int32_t> header(kShardHeaderInts);
  std::memcpy(header.data(), bytes.data(), 1024);
  CHECK(header[0] == 20240801);  // llm.c's dev/data/data_common.py, "llama-3"
  CHECK(header[1] == 7);
  CHECK(header[2] == static_cast<int32_t>(tokens.size()));
  for (int i = 3; i < kShardHeaderInts; ++i) CHECK(header[i] == 0);
  uint32_t third = 0;
  std::memcpy(&third, bytes.data() + 1024 + 2 * 4, 4);
  CHECK(third == 65536);  // little-endian uint32s right after the header

  const TokenShard shard(path);
  CHECK(&shard.format() == &kUint32Shards);
  CHECK(read_tokens(path) == tokens);
  std::vector<uint32_t> middle(3);
  shard.read(3, 3, middle.data());
  CHECK(middle == std::vector<uint32_t>{128000, 128255, 16777215});

  // The stream checks them against the model's vocabulary as it does uint16 ids.
  const TokenStream stream({path}, "data.train", 128256);
  std::vector<int32_t> out(5);
  stream.copy(0, 5, out.data());
  CHECK(out == std::vector<int32_t>{0, 65535, 65536, 128000, 128255});
  const std::string message = user_error([&] { stream.copy(3, 3, out.data()); });
  CHECK(message == "data.train: token id 16777215 at position 5 of \"" + path +
                       "\" is not below model.vocab_size 128256; expected shards made with this model's vocabulary");
}

TEST_CASE("the shard format follows the vocabulary: uint16 while every id fits", "[data]") {
  CHECK(&shard_format_for(256) == &kUint16Shards);
  CHECK(&shard_format_for(50257) == &kUint16Shards);
  CHECK(&shard_format_for(65536) == &kUint16Shards);  // ids 0..65535
  CHECK(&shard_format_for(65537) == &kUint32Shards);
  CHECK(&shard_format_for(128256) == &kUint32Shards);
}

TEST_CASE("a split whose shards mix uint16 and uint32 is refused, naming both", "[data]") {
  TempDir dir;
  write_shard(dir / "train_000.bin", iota_tokens(0, 10));
  write_shard(dir / "train_001.bin", std::vector<uint32_t>{70000, 1, 2});
  const std::string message =
      user_error([&] { TokenStream s(expand_shard_glob(dir / "train_*.bin", "data.train"), "data.train", 128256); });
  CHECK(message == "data.train: \"" + (dir / "train_001.bin") +
                       "\" is in llm.c's Llama 3 format, uint32 tokens but \"" + (dir / "train_000.bin") +
                       "\" is in llm.c's GPT-2 format, uint16 tokens; expected the shards of one vocabulary, in one "
                       "format");
}

TEST_CASE("an empty shard is valid", "[data]") {
  TempDir dir;
  write_shard(dir / "empty.bin", std::vector<uint16_t>{});
  CHECK(TokenShard(dir / "empty.bin").size() == 0);
  write_shard(dir / "empty32.bin", std::vector<uint32_t>{});
  CHECK(TokenShard(dir / "empty32.bin").size() == 0);
}

TEST_CASE("bad shards are user errors naming the file and what was expected", "[data]") {
  TempDir dir;
  const std::string path = dir / "bad_000.bin";
  std::string message;
  SECTION("wrong magic") {
    write_raw_shard(path, 12345, 1, 4, 8);
    message = user_error([&] { TokenShard s(path); });
    CHECK_THAT(message, Catch::Contains("begins with 12345, expected the magic number 20240520 (llm.c's GPT-2 "
                                        "format, uint16 tokens) or 20240801 (llm.c's Llama 3 format, uint32 tokens)"));
  }
  SECTION("wrong version") {
    write_raw_shard(path, kUint16Shards.magic, 2, 4, 8);
    message = user_error([&] { TokenShard s(path); });
    CHECK_THAT(message, Catch::Contains("magic 20240520 and version 2, expected version 1"));
  }
  SECTION("the other format's version: the width would be wrong") {
    write_raw_shard(path, kUint32Shards.magic, 1, 4, 8);
    message = user_error([&] { TokenShard s(path); });
    CHECK_THAT(message, Catch::Contains("magic 20240801 and version 1, expected version 7 (llm.c's Llama 3 format, "
                                        "uint32 tokens)"));
  }
  SECTION("truncated tokens") {
    write_raw_shard(path, kUint16Shards.magic, 1, 4, 7);
    message = user_error([&] { TokenShard s(path); });
    CHECK_THAT(message, Catch::Contains("1031 bytes") && Catch::Contains("1032"));
  }
  SECTION("extra bytes") {
    write_raw_shard(path, kUint16Shards.magic, 1, 4, 10);
    message = user_error([&] { TokenShard s(path); });
    CHECK_THAT(message, Catch::Contains("1034 bytes") && Catch::Contains("1032"));
  }
  SECTION("uint32 tokens counted at two bytes each") {
    write_raw_shard(path, kUint32Shards.magic, 7, 4, 8);
    message = user_error([&] { TokenShard s(path); });
    CHECK_THAT(message, Catch::Contains("1032 bytes but its header says 4 tokens, expected 1024 + 4 * 4 = 1040 bytes"));
  }
  SECTION("shorter than the header") {
    std::ofstream(path) << "tiny";
    message = user_error([&] { TokenShard s(path); });
    CHECK_THAT(message, Catch::Contains("4 bytes"));
  }
  SECTION("missing") {
    message = user_error([&] { TokenShard s(dir / "absent.bin"); });
    CHECK_THAT(message, Catch::Contains("absent.bin") && Catch::Contains("does not exist"));
    return;
  }
  CHECK_THAT(message, Catch::Contains("\"" + path + "\"") && Catch::Contains("expected"));
}

TEST_CASE("a shard truncated while it is read names where it ends now", "[data]") {
  TempDir dir;
  const std::string path = dir / "train_000.bin";
  write_shard(path, std::vector<uint16_t>(1000, 3));
  const TokenShard shard(path);
  std::filesystem::resize_file(path, 1024 + 100);  // 50 tokens left of 1000
  std::vector<uint32_t> out(10);
  const std::string message = user_error([&] { shard.read(900, 10, out.data()); });
  CHECK_THAT(message, Catch::Contains("ends at byte 1124 although it was 3024 bytes when opened (reading byte 2824)"));
}

TEST_CASE("a bad shard in a stream is reported with its config key", "[data]") {
  TempDir dir;
  write_raw_shard(dir / "train_000.bin", 12345, 1, 0, 0);
  const std::string message = user_error([&] { TokenStream s(expand_shard_glob(dir / "train_*.bin", "data.train"), "data.train", 256); });
  CHECK_THAT(message, Catch::StartsWith("data.train: shard \"" + (dir / "train_000.bin") + "\" begins with 12345, expected the magic number 20240520"));
}

TEST_CASE("expand_shard_glob sorts matches and names the key when nothing matches", "[data]") {
  TempDir dir;
  for (const char* name : {"train_002.bin", "train_000.bin", "train_001.bin", "val_000.bin"})
    write_shard(dir / name, std::vector<uint16_t>{1});
  CHECK(expand_shard_glob(dir / "train_*.bin", "data.train") ==
        std::vector<std::string>{dir / "train_000.bin", dir / "train_001.bin", dir / "train_002.bin"});

  const std::string pattern = dir / "nothing_*.bin";
  const std::string message = user_error([&] { expand_shard_glob(pattern, "data.val"); });
  CHECK_THAT(message, Catch::StartsWith("data.val:") && Catch::Contains("\"" + pattern + "\"") &&
                          Catch::Contains("expected"));
}

TEST_CASE("a token outside the vocabulary is a user error with its position, when it is read", "[data]") {
  TempDir dir;
  std::vector<uint16_t> tokens(30, 7);
  tokens[17] = 300;
  write_shard(dir / "val_000.bin", iota_tokens(0, 10));
  write_shard(dir / "val_001.bin", tokens);
  // Opening checks headers only, so a large corpus opens without a pass over its tokens.
  const TokenStream stream(expand_shard_glob(dir / "val_*.bin", "data.val"), "data.val", 256);
  std::vector<int32_t> out(40);
  stream.copy(0, 27, out.data());  // up to the bad token
  const std::string message = user_error([&] { stream.copy(20, 10, out.data()); });
  CHECK(message == "data.val: token id 300 at position 17 of \"" + (dir / "val_001.bin") +
                       "\" is not below model.vocab_size 256; expected shards made with this model's vocabulary");
  const TokenStream wider(expand_shard_glob(dir / "val_*.bin", "data.val"), "data.val", 301);
  wider.copy(0, 40, out.data());
  CHECK(out[27] == 300);
}

TEST_CASE("TokenStream concatenates shards and copies across boundaries", "[data]") {
  TempDir dir;
  write_shard(dir / "s_000.bin", iota_tokens(0, 10));
  write_shard(dir / "s_001.bin", std::vector<uint16_t>{});
  write_shard(dir / "s_002.bin", iota_tokens(10, 5));
  write_shard(dir / "s_003.bin", iota_tokens(15, 10));
  TokenStream stream(expand_shard_glob(dir / "s_*.bin", "data.train"), "data.train", 256);
  CHECK(stream.size() == 25);
  CHECK(stream.files().size() == 4);

  std::vector<int32_t> out(12, -1);
  stream.copy(7, 12, out.data());
  for (int i = 0; i < 12; ++i) CHECK(out[i] == 7 + i);
  stream.copy(10, 1, out.data());
  CHECK(out[0] == 10);
  stream.copy(0, 25, std::vector<int32_t>(25).data());
  CHECK_THROWS_AS(stream.copy(20, 6, out.data()), std::logic_error);
}

TEST_CASE("TrainSampler windows are a pure function of seed and sample index", "[data]") {
  TempDir dir;
  // Token value = position, so a window's values reveal where it starts.
  write_shard(dir / "train_000.bin", iota_tokens(0, 3000));
  write_shard(dir / "train_001.bin", iota_tokens(3000, 2000));
  TokenStream stream(expand_shard_glob(dir / "train_*.bin", "data.train"), "data.train", 65536);
  const int B = 8, T = 64;
  auto windows = [&](uint64_t seed, int64_t first, int batch) {
    std::vector<int32_t> in(batch * T), tgt(batch * T);
    TrainSampler(stream, seed, T).fill(first, batch, in.data(), tgt.data());
    return std::make_pair(in, tgt);
  };

  const auto a = windows(42, 0, B);
  CHECK(a == windows(42, 0, B));
  CHECK(a.first != windows(43, 0, B).first);
  // Sample i is the same window whichever batch it falls in.
  const auto tail = windows(42, 5, 3);
  CHECK(std::vector<int32_t>(a.first.begin() + 5 * T, a.first.end()) == tail.first);

  for (int b = 0; b < B; ++b) {
    const int32_t start = a.first[b * T];
    CHECK(start >= 0);
    CHECK(start < stream.size() - T);
    for (int t = 0; t < T; ++t) {
      CHECK(a.first[b * T + t] == start + t);
      CHECK(a.second[b * T + t] == start + t + 1);
    }
  }
}

TEST_CASE("TrainSampler needs one window of training data", "[data]") {
  TempDir dir;
  write_shard(dir / "train_000.bin", iota_tokens(0, 64));
  TokenStream stream(expand_shard_glob(dir / "train_*.bin", "data.train"), "data.train", 256);
  const std::string message = user_error([&] { TrainSampler(stream, 1, 64); });
  CHECK_THAT(message, Catch::Contains("data.train: the training data has 64 tokens") && Catch::Contains("65"));
  std::vector<int32_t> in(63), tgt(63);
  TrainSampler(stream, 1, 63).fill(0, 1, in.data(), tgt.data());
  CHECK(in[0] == 0);
  CHECK(tgt[62] == 63);
}

TEST_CASE("ValSampler takes consecutive windows and needs enough tokens", "[data]") {
  TempDir dir;
  write_shard(dir / "val_000.bin", iota_tokens(0, 100));
  TokenStream stream(expand_shard_glob(dir / "val_*.bin", "data.val"), "data.val", 256);

  ValSampler val(stream, "data.val", 3, 2, 16);  // needs 3*2*16 + 1 = 97 tokens
  CHECK(val.batches() == 3);
  std::vector<int32_t> in(32), tgt(32);
  val.fill(2, in.data(), tgt.data());
  for (int i = 0; i < 32; ++i) {
    CHECK(in[i] == 64 + i);
    CHECK(tgt[i] == 65 + i);
  }

  const std::string message = user_error([&] { ValSampler(stream, "data.val", 4, 2, 16); });
  CHECK_THAT(message, Catch::StartsWith("data.val:") && Catch::Contains("100 tokens") &&
                          Catch::Contains("129") && Catch::Contains("training.eval_batches"));
}

TEST_CASE("Markov rows have exactly `branching` successors with probabilities summing to 1", "[data]") {
  SyntheticSpec spec;
  spec.vocab = 50;
  spec.order = 2;
  spec.seed = 7;
  for (int branching : {1, 5, 50}) {
    spec.branching = branching;
    MarkovSource source(spec);
    for (int c = 0; c < 40; ++c) {
      const uint32_t context[2] = {static_cast<uint32_t>(c), static_cast<uint32_t>((c * 7) % 50)};
      double sum = 0;
      int nonzero = 0;
      for (int next = 0; next < spec.vocab; ++next) {
        const double p = source.probability(context, static_cast<uint32_t>(next));
        sum += p;
        nonzero += p > 0;
      }
      CHECK(std::abs(sum - 1.0) < 1e-12);
      CHECK(nonzero == branching);
      for (double u : {0.0, 0.3, 0.999999}) CHECK(source.probability(context, source.sample(context, u)) > 0);
    }
  }
}

TEST_CASE("Markov rows depend on the seed and the context", "[data]") {
  SyntheticSpec spec;
  spec.vocab = 1000;
  spec.order = 2;
  spec.branching = 3;
  const uint32_t c1[2] = {1, 2}, c2[2] = {2, 1};
  MarkovSource a(spec);
  spec.seed = 2;
  MarkovSource b(spec);
  auto successors = [](const MarkovSource& s, const uint32_t* c) {
    std::vector<int> out;
    for (int t = 0; t < 1000; ++t)
      if (s.probability(c, static_cast<uint32_t>(t)) > 0) out.push_back(t);
    return out;
  };
  CHECK(successors(a, c1) != successors(a, c2));
  CHECK(successors(a, c1) != successors(b, c1));
}

TEST_CASE("synthetic generation is deterministic and its oracle loss is the true mean NLL", "[data]") {
  TempDir dir;
  SyntheticSpec spec;
  spec.vocab = 64;
  spec.order = 2;
  spec.branching = 4;
  spec.tokens = 20000;
  spec.seed = 3;
  spec.val_fraction = 0.25;
  const SyntheticInfo info = generate_synthetic(spec, dir / "a/b");
  CHECK(info.train_tokens == 15000);
  CHECK(info.val_tokens == 5000);

  generate_synthetic(spec, dir / "again");
  for (const char* f : {"train_000000.bin", "val_000000.bin", "synthetic.json"})
    CHECK(file_bytes(dir / ("a/b/" + std::string(f))) == file_bytes(dir / ("again/" + std::string(f))));
  spec.seed = 4;
  generate_synthetic(spec, dir / "other");
  CHECK(file_bytes(dir / "a/b/train_000000.bin") != file_bytes(dir / "other/train_000000.bin"));
  spec.seed = 3;

  CHECK(&TokenShard(dir / "a/b/train_000000.bin").format() == &kUint16Shards);
  std::vector<uint32_t> stream = read_tokens(dir / "a/b/train_000000.bin");
  const std::vector<uint32_t> val = read_tokens(dir / "a/b/val_000000.bin");
  REQUIRE(stream.size() == 15000);
  REQUIRE(val.size() == 5000);
  stream.insert(stream.end(), val.begin(), val.end());

  MarkovSource source(spec);
  double nll_train = 0, nll_val = 0;
  for (size_t p = spec.order; p < stream.size(); ++p) {
    const double nll = -std::log(source.probability(&stream[p - spec.order], stream[p]));
    (p < 15000 ? nll_train : nll_val) += nll;
  }
  CHECK(std::abs(nll_val / 5000 - info.oracle_loss_val) < 1e-9);
  CHECK(std::abs(nll_train / (15000 - spec.order) - info.oracle_loss_train) < 1e-9);
  for (double loss : {info.oracle_loss_train, info.oracle_loss_val}) {
    CHECK(loss > 0);
    CHECK(loss < std::log(4.0));
  }

  const auto read = read_synthetic_info(dir / "a/b");
  REQUIRE(read.has_value());
  CHECK(read->spec.vocab == 64);
  CHECK(read->spec.order == 2);
  CHECK(read->spec.branching == 4);
  CHECK(read->spec.tokens == 20000);
  CHECK(read->spec.seed == 3);
  CHECK(read->spec.val_fraction == 0.25);
  CHECK(read->train_tokens == 15000);
  CHECK(read->val_tokens == 5000);
  CHECK(read->oracle_loss_train == info.oracle_loss_train);
  CHECK(read->oracle_loss_val == info.oracle_loss_val);
}

TEST_CASE("a synthetic corpus past 65,536 tokens is written as uint32 shards with its ids intact", "[data]") {
  TempDir dir;
  SyntheticSpec spec;
  spec.vocab = 128256;  // Llama 3's vocabulary size
  spec.order = 1;
  spec.branching = 3;
  spec.tokens = 4000;
  spec.seed = 5;
  const SyntheticInfo info = generate_synthetic(spec, dir / "wide");
  std::vector<uint32_t> stream;
  for (const char* split : {"train_000000.bin", "val_000000.bin"}) {
    CHECK(&TokenShard(dir / ("wide/" + std::string(split))).format() == &kUint32Shards);
    const std::vector<uint32_t> part = read_tokens(dir / ("wide/" + std::string(split)));
    stream.insert(stream.end(), part.begin(), part.end());
  }
  REQUIRE(stream.size() == 4000);
  // The source draws its first token uniformly and its successors from the whole vocabulary:
  // with 4,000 tokens ids past 65,535 occur, and the oracle recomputed from the shards equals
  // the one generation recorded, so no id was cut to 16 bits on the way.
  CHECK(std::any_of(stream.begin(), stream.end(), [](uint32_t id) { return id > 65535; }));
  const MarkovSource source(spec);
  double nll_val = 0;
  for (size_t p = static_cast<size_t>(info.train_tokens); p < stream.size(); ++p)
    nll_val -= std::log(source.probability(&stream[p - 1], stream[p]));
  CHECK(std::abs(nll_val / static_cast<double>(info.val_tokens) - info.oracle_loss_val) < 1e-9);
}

TEST_CASE("synthetic specs are validated", "[data]") {
  TempDir dir;
  SyntheticSpec spec;
  spec.tokens = 1000;
  std::string key;
  SECTION("vocab") { spec.vocab = 1; key = "data.synthetic.vocab"; }
  SECTION("vocab too large") { spec.vocab = (1 << 20) + 1; key = "data.synthetic.vocab"; }
  SECTION("order") { spec.order = 0; key = "data.synthetic.order"; }
  SECTION("branching") { spec.branching = 257; key = "data.synthetic.branching"; }
  SECTION("val_fraction") { spec.val_fraction = 1.0; key = "data.synthetic.val_fraction"; }
  SECTION("tokens") { spec.tokens = 20; key = "data.synthetic.tokens"; }  // val gets 2 <= order
  const std::string message = user_error([&] { generate_synthetic(spec, dir / "out"); });
  CHECK_THAT(message, Catch::Contains(key) && Catch::Contains("expected"));
  CHECK_FALSE(fs::exists(dir / "out"));
  // ptrain data synth names its flags instead: --val-fraction, not data.synthetic.val_fraction.
  std::string flag = "--" + key.substr(std::string("data.synthetic.").size());
  std::replace(flag.begin(), flag.end(), '_', '-');
  const std::string from_flags = user_error([&] { generate_synthetic(spec, dir / "out", SpecSource::flags); });
  CHECK_THAT(from_flags, Catch::Contains(flag + " is ") && !Catch::Contains("data.synthetic"));
}

TEST_CASE("a wrong synthetic vocabulary is blamed alone, not the branching measured against it", "[data]") {
  SyntheticSpec spec;
  spec.vocab = 0;
  const std::vector<std::string> problems = synthetic_spec_problems(spec, SpecSource::flags);
  REQUIRE(problems.size() == 1);
  CHECK_THAT(problems[0], Catch::StartsWith("--vocab is 0"));
}

TEST_CASE("read_synthetic_info is empty without the file and rejects a malformed one", "[data]") {
  TempDir dir;
  CHECK_FALSE(read_synthetic_info(dir.path.string()).has_value());
  std::ofstream(dir / "synthetic.json") << "{\"vocab\": 256}";
  const std::string message = user_error([&] { read_synthetic_info(dir.path.string()); });
  CHECK_THAT(message, Catch::Contains("synthetic.json") && Catch::Contains("malformed"));
}

TEST_CASE("a blend gives each source its weight's share of every prefix of the samples, within K - 1 of K sources",
          "[data]") {
  struct Case {
    std::vector<double> weights;
  };
  for (const Case& c : {Case{{0.7, 0.3}}, Case{{1, 2, 3}}, Case{{0.5, 0, 0.5}}, Case{{3, 0}}, Case{{0.1, 0.2, 0.3, 0.4}},
                        Case{{1}}}) {
    CAPTURE(c.weights);
    const SourceBlend blend(c.weights);
    REQUIRE(blend.sources() == static_cast<int>(c.weights.size()));
    const double total = std::accumulate(c.weights.begin(), c.weights.end(), 0.0);
    std::vector<int64_t> drawn(c.weights.size(), 0);
    for (int64_t n = 1; n <= 5000; ++n) {
      ++drawn[static_cast<size_t>(blend.source_of(n - 1))];
      // What counts() says is what source_of() drew, and each is within one sample per source
      // of the exact share.
      REQUIRE(blend.counts(n) == drawn);
      for (size_t k = 0; k < drawn.size(); ++k) {
        const double exact = static_cast<double>(n) * c.weights[k] / total;
        REQUIRE(std::abs(static_cast<double>(drawn[k]) - exact) <= std::max(1.0, c.weights.size() - 1.0));
        if (c.weights[k] == 0) REQUIRE(drawn[k] == 0);
      }
    }
  }
  // Far into a long run the rule is the same function of the index.
  const SourceBlend blend({0.7, 0.3});
  const std::vector<int64_t> late = blend.counts(int64_t{1} << 40);
  CHECK(std::abs(static_cast<double>(late[0]) - 0.7 * static_cast<double>(int64_t{1} << 40)) <= 1);
  CHECK(late[0] + late[1] == int64_t{1} << 40);
}

TEST_CASE("a blended sampler draws each window whole from the source the blend names", "[data]") {
  TempDir dir;
  // Source a holds ids 0..99, source b ids 100..199: a window's first id says where it came from.
  std::vector<uint16_t> a, b;
  for (int i = 0; i < 3000; ++i) {
    a.push_back(static_cast<uint16_t>(i % 100));
    b.push_back(static_cast<uint16_t>(100 + i % 100));
  }
  write_shard(dir / "a.bin", a);
  write_shard(dir / "b.bin", b);
  const TokenStream sa({dir / "a.bin"}, "data.sources[1].train", 200), sb({dir / "b.bin"}, "data.sources[2].train", 200);
  const int T = 8, B = 16, steps = 200;
  const TrainSampler blended({&sa, &sb}, {0.7, 0.3}, 11, T);
  const TrainSampler only_a(sa, 11, T);
  std::vector<int32_t> inputs(B * T), targets(B * T), alone(B * T), alone_targets(B * T);
  int64_t from_a = 0;
  for (int step = 0; step < steps; ++step) {
    blended.fill(int64_t{step} * B, B, inputs.data(), targets.data());
    only_a.fill(int64_t{step} * B, B, alone.data(), alone_targets.data());
    for (int s = 0; s < B; ++s) {
      const int64_t sample = int64_t{step} * B + s;
      const bool in_a = inputs[s * T] < 100;
      REQUIRE(in_a == (blended.blend().source_of(sample) == 0));
      for (int t = 0; t < T; ++t) REQUIRE((inputs[s * T + t] < 100) == in_a);
      // A window from a is the one a sampler over a alone draws for that sample index.
      if (in_a) REQUIRE(std::equal(alone.begin() + s * T, alone.begin() + (s + 1) * T, inputs.begin() + s * T));
      from_a += in_a;
    }
  }
  CHECK(std::abs(static_cast<double>(from_a) / (steps * B) - 0.7) < 0.01);
}

TEST_CASE("a blend source too short for a window is named by its key", "[data]") {
  TempDir dir;
  write_shard(dir / "a.bin", iota_tokens(0, 100));
  write_shard(dir / "b.bin", iota_tokens(0, 8));
  const TokenStream sa({dir / "a.bin"}, "data.sources[1].train", 256), sb({dir / "b.bin"}, "data.sources[2].train", 256);
  const std::string message = user_error([&] { TrainSampler s({&sa, &sb}, {1, 1}, 0, 8); });
  CHECK(message == "data.sources[2].train: the training data has 8 tokens, expected at least seq_len + 1 = 9 for one "
                   "training window (lower training.seq_len or add data)");
}
