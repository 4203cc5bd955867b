#include "data/synthetic.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <filesystem>
#include <sstream>
#include <nlohmann/json.hpp>

#include "config/config.h"
#include "core/error.h"
#include "core/format.h"
#include "core/input_file.h"
#include "core/json_input.h"
#include "core/output_file.h"
#include "core/paths.h"
#include "core/rng.h"
#include "data/shard.h"

namespace ptrain {

namespace fs = std::filesystem;

namespace {

// A spec field as its source names it: data.synthetic.val_fraction or --val-fraction.
std::string named(const char* field, SpecSource from) {
  if (from == SpecSource::config) return std::string("data.synthetic.") + field;
  std::string flag = std::string("--") + field;
  std::replace(flag.begin(), flag.end(), '_', '-');
  return flag;
}

// Problems that make the source itself undefined (MarkovSource rejects these too).
std::vector<std::string> source_problems(const SyntheticSpec& spec, SpecSource from) {
  std::vector<std::string> problems;
  const bool vocab_ok = spec.vocab >= 2 && spec.vocab <= kMaxVocab;
  if (!vocab_ok)
    problems.push_back(named("vocab", from) + " is " + std::to_string(spec.vocab) + ", expected 2.." +
                       std::to_string(kMaxVocab));
  if (spec.order < 1)
    problems.push_back(named("order", from) + " is " + std::to_string(spec.order) + ", expected at least 1");
  // Measured against a vocabulary that is itself wrong, branching would be blamed for it.
  if (vocab_ok && (spec.branching < 1 || spec.branching > spec.vocab))
    problems.push_back(named("branching", from) + " is " + std::to_string(spec.branching) + ", expected 1.." +
                       named("vocab", from) + " (" + std::to_string(spec.vocab) + ")");
  return problems;
}

int64_t train_split(const SyntheticSpec& spec) {
  return std::llround((1.0 - spec.val_fraction) * static_cast<double>(spec.tokens));
}

}  // namespace

std::vector<std::string> synthetic_spec_problems(const SyntheticSpec& spec, SpecSource from) {
  std::vector<std::string> problems = source_problems(spec, from);
  if (!(spec.val_fraction > 0 && spec.val_fraction < 1)) {
    problems.push_back(named("val_fraction", from) + " is " + number_text(spec.val_fraction) +
                       ", expected a fraction strictly between 0 and 1");
    return problems;
  }
  if (spec.tokens > INT32_MAX)
    problems.push_back(named("tokens", from) + " is " + std::to_string(spec.tokens) +
                       ", expected at most 2147483647 (one llm.c shard per split)");
  const int64_t train = train_split(spec);
  const int64_t val = spec.tokens - train;
  if (train <= spec.order || val <= spec.order)
    problems.push_back(named("tokens", from) + " is " + std::to_string(spec.tokens) + ", which gives " +
                       std::to_string(train) + " train and " + std::to_string(val) + " val tokens; expected more than " +
                       named("order", from) + " (" + std::to_string(spec.order) + ") in each split");
  return problems;
}

namespace {

// Tags the hash stream that picks a row's successors, apart from the one that weights them.
constexpr uint64_t kSupportStream = 0x5355505030525400ull;

// A 64-bit key for the K tokens of a context: the row's hash stream is keyed by it.
uint64_t context_key(const uint32_t* context, int order) {
  uint64_t key = 0;
  for (int k = 0; k < order; ++k) key = hash_combine(key, context[k]);
  return key;
}

// Uniform in (0, 1), never 0, so -log(u) is finite and every successor keeps a positive weight.
double open_uniform(Rng& rng) {
  return (static_cast<double>(rng.next_u64() >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

nlohmann::json info_to_json(const SyntheticInfo& info) {
  const SyntheticSpec& s = info.spec;
  return {{"vocab", s.vocab},
          {"order", s.order},
          {"branching", s.branching},
          {"tokens", s.tokens},
          {"seed", s.seed},
          {"val_fraction", s.val_fraction},
          {"train_tokens", info.train_tokens},
          {"val_tokens", info.val_tokens},
          {"oracle_loss_train", info.oracle_loss_train},
          {"oracle_loss_val", info.oracle_loss_val},
          {"source", "ptrain sparse order-K Markov"}};
}

SyntheticInfo info_from_json(const nlohmann::json& j) {
  SyntheticInfo info;
  SyntheticSpec& s = info.spec;
  j.at("vocab").get_to(s.vocab);
  j.at("order").get_to(s.order);
  j.at("branching").get_to(s.branching);
  j.at("tokens").get_to(s.tokens);
  j.at("seed").get_to(s.seed);
  j.at("val_fraction").get_to(s.val_fraction);
  j.at("train_tokens").get_to(info.train_tokens);
  j.at("val_tokens").get_to(info.val_tokens);
  j.at("oracle_loss_train").get_to(info.oracle_loss_train);
  j.at("oracle_loss_val").get_to(info.oracle_loss_val);
  return info;
}

void write_info(const SyntheticInfo& info, const std::string& path) {
  write_file_atomic(path, info_to_json(info).dump(2) + "\n");
}

// `count` tokens as a shard in the format of the vocabulary (shard_format_for).
void write_split(const std::string& path, const uint32_t* tokens, size_t count, int vocab) {
  if (&shard_format_for(vocab) == &kUint32Shards)
    write_shard(path, tokens, count);
  else
    write_shard(path, std::vector<uint16_t>(tokens, tokens + count));
}

}  // namespace

MarkovSource::MarkovSource(const SyntheticSpec& spec) : spec_(spec) {
  std::vector<std::string> problems = source_problems(spec, SpecSource::config);
  if (!problems.empty()) throw UserErrors(problems);
}

MarkovSource::Row MarkovSource::row(const uint32_t* context) const {
  // Which tokens may follow depends on the last token only; how likely each is depends on the
  // whole K-token context. A model first learns the sparse support from the current token
  // (a quick, visible drop in loss), then needs attention to earlier tokens to reach the floor.
  Rng rng(spec_.seed, hash_combine(kSupportStream, context[spec_.order - 1]));
  Rng weights(spec_.seed, context_key(context, spec_.order));
  Row r;
  r.successors.reserve(spec_.branching);
  // Floyd's algorithm: `branching` distinct tokens with one draw each, kept sorted. Every value
  // drawn so far is below j, so j itself is new and belongs at the end.
  for (int j = spec_.vocab - spec_.branching; j < spec_.vocab; ++j) {
    const auto t = static_cast<uint32_t>(rng.below(static_cast<uint64_t>(j) + 1));
    auto at = std::lower_bound(r.successors.begin(), r.successors.end(), t);
    if (at != r.successors.end() && *at == t)
      r.successors.push_back(static_cast<uint32_t>(j));
    else
      r.successors.insert(at, t);
  }
  // Normalised Exp(1) weights are Dirichlet(1): uniform over the probability simplex.
  double sum = 0;
  for (int i = 0; i < spec_.branching; ++i) {
    r.probs.push_back(-std::log(open_uniform(weights)));
    sum += r.probs.back();
  }
  for (double& p : r.probs) p /= sum;
  return r;
}

double MarkovSource::probability(const uint32_t* context, uint32_t next) const {
  const Row r = row(context);
  auto at = std::lower_bound(r.successors.begin(), r.successors.end(), next);
  if (at == r.successors.end() || *at != next) return 0.0;
  return r.probs[static_cast<size_t>(at - r.successors.begin())];
}

uint32_t MarkovSource::sample(const uint32_t* context, double u) const {
  const Row r = row(context);
  double cumulative = 0;
  for (size_t i = 0; i < r.successors.size(); ++i) {
    cumulative += r.probs[i];
    if (u < cumulative) return r.successors[i];
  }
  return r.successors.back();  // u within rounding of 1
}

SyntheticInfo generate_synthetic(const SyntheticSpec& spec, const std::string& out_dir, SpecSource from) {
  std::vector<std::string> problems = synthetic_spec_problems(spec, from);
  if (!problems.empty()) throw UserErrors(problems);
  const MarkovSource source(spec);
  const int K = spec.order;
  const int64_t train = train_split(spec);

  Rng rng(spec.seed);
  std::vector<uint32_t> stream(static_cast<size_t>(spec.tokens));
  for (int k = 0; k < K; ++k) stream[k] = static_cast<uint32_t>(rng.below(spec.vocab));
  double nll_train = 0, nll_val = 0;
  for (int64_t p = K; p < spec.tokens; ++p) {
    const uint32_t* context = &stream[p - K];
    stream[p] = source.sample(context, rng.uniform_double());
    (p < train ? nll_train : nll_val) -= std::log(source.probability(context, stream[p]));
  }

  SyntheticInfo info{spec, train, spec.tokens - train, 0, 0};
  info.oracle_loss_train = nll_train / static_cast<double>(train - K);
  info.oracle_loss_val = nll_val / static_cast<double>(info.val_tokens);
  make_shard_dir(out_dir);
  const fs::path dir(out_dir);
  write_split(synthetic_train_file(out_dir), stream.data(), static_cast<size_t>(train), spec.vocab);
  write_split(synthetic_val_file(out_dir), stream.data() + train, static_cast<size_t>(info.val_tokens), spec.vocab);
  write_info(info, (dir / "synthetic.json").string());
  return info;
}

bool holds_only_synthetic_corpus(const std::string& dir) {
  std::error_code ec;
  if (fs::symlink_status(fs::path(dir) / "synthetic.json", ec).type() != fs::file_type::regular) return false;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if ((name != "train_000000.bin" && name != "val_000000.bin" && name != "synthetic.json") ||
        it->symlink_status(ec).type() != fs::file_type::regular)
      return false;
  }
  return !ec;
}

std::string synthetic_train_file(const std::string& dir) { return (fs::path(dir) / "train_000000.bin").string(); }
std::string synthetic_val_file(const std::string& dir) { return (fs::path(dir) / "val_000000.bin").string(); }

std::optional<SyntheticInfo> read_synthetic_info(const std::string& dir) {
  const fs::path path = fs::path(dir) / "synthetic.json";
  if (path_kind(path.string(), "synthetic.json") == PathKind::missing) return std::nullopt;
  const InputFile in(path.string(), "\"" + path.string() + "\"");
  try {
    return info_from_json(parse_json(in.read_all(1 << 20), "\"" + path.string() + "\""));
  } catch (const nlohmann::json::exception& e) {
    throw UserError("\"" + path.string() + "\" is malformed (" + e.what() +
                    "), expected the synthetic.json written with the corpus; regenerate it");
  }
}

}  // namespace ptrain
