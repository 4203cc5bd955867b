// Synthetic corpora from a random sparse order-K Markov source with a known entropy floor.
// Each context (the previous K tokens) allows `branching` successor tokens, chosen by the last
// token, with random Dirichlet(1) probabilities chosen by the whole context; both derive from
// hashes of (seed, tokens), so the source needs no table.
// The oracle loss of a split is the mean of -log p_true(token | context) over its tokens: no
// model can beat it, so "gap to oracle" measures how much a model has left to learn.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ptrain {

struct SyntheticSpec {
  int vocab = 256;
  int order = 2;
  int branching = 4;
  int64_t tokens = 1000000;  // train + val
  uint64_t seed = 1;
  double val_fraction = 0.1;
};

struct SyntheticInfo {
  SyntheticSpec spec;
  int64_t train_tokens = 0;
  int64_t val_tokens = 0;
  double oracle_loss_train = 0;
  double oracle_loss_val = 0;
};

class MarkovSource {
 public:
  explicit MarkovSource(const SyntheticSpec& spec);
  // Probability of `next` after the K tokens ending at context[K-1].
  double probability(const uint32_t* context, uint32_t next) const;
  // Draws the next token after `context` (K tokens) using uniform u in [0, 1).
  uint32_t sample(const uint32_t* context, double u) const;

 private:
  struct Row {
    std::vector<uint32_t> successors;
    std::vector<double> probs;
  };
  Row row(const uint32_t* context) const;
  SyntheticSpec spec_;
};

// Where a spec came from, for the names its problems give: the config's data.synthetic.* keys,
// or `ptrain data synth`'s flags (--vocab, --val-fraction, ...).
enum class SpecSource { config, flags };

// What is wrong with a corpus spec (the source, the size, the split), each naming its key or
// flag; empty when it can be generated.
std::vector<std::string> synthetic_spec_problems(const SyntheticSpec& spec, SpecSource from = SpecSource::config);

// Generates the corpus (a stream started from a seeded random context) and writes
// Whether `dir` holds a corpus generate_synthetic wrote (synthetic.json) and nothing else: what
// data synth --force may replace.
bool holds_only_synthetic_corpus(const std::string& dir);

// <out_dir>/train_000000.bin, <out_dir>/val_000000.bin and <out_dir>/synthetic.json. Throws
// UserErrors for an impossible spec, EnvironmentError when a file cannot be written.
SyntheticInfo generate_synthetic(const SyntheticSpec& spec, const std::string& out_dir,
                                 SpecSource from = SpecSource::config);

// The shards generate_synthetic writes into `dir`.
std::string synthetic_train_file(const std::string& dir);
std::string synthetic_val_file(const std::string& dir);

// Reads <dir>/synthetic.json if present (the directory of a split's shards).
std::optional<SyntheticInfo> read_synthetic_info(const std::string& dir);

}  // namespace ptrain
