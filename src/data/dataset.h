// A split (train or val) as one logical token stream over its shards, and the samplers that
// cut (B, T+1) windows from it. Sampling is a pure function of (seed, sample index): the data
// position of a run is one counter, and ranks take disjoint sample indices.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/blend.h"
#include "data/shard.h"

namespace ptrain {

class TokenStream {
 public:
  // Opens every shard in `files` and validates each one's header and size, and that all share
  // one format (token width). `key` names the config key in errors (e.g. "data.train"). Tokens
  // are checked against `vocab_size` as they are read, so opening a large corpus costs no pass
  // over its tokens.
  TokenStream(const std::vector<std::string>& files, const std::string& key, int vocab_size);

  int64_t size() const { return total_; }
  const std::string& key() const { return key_; }
  const std::vector<std::string>& files() const { return files_; }
  const ShardFormat& format() const;  // the shards' one format
  // Copies tokens [pos, pos + n) of the concatenated stream (may span shards) as int32. Throws
  // UserError naming the shard and position of a token id not below the vocabulary size.
  void copy(int64_t pos, int64_t n, int32_t* out) const;

 private:
  std::vector<std::string> files_;
  std::vector<TokenShard> shards_;
  std::vector<int64_t> starts_;  // offset of each shard in the stream
  int64_t total_ = 0;
  std::string key_;
  int vocab_size_;
};

// Training windows: sample i starts at hash(seed, i) mod (size - T), uniformly over the stream;
// over a blend of streams (data.sources), over the stream SourceBlend gives sample i.
class TrainSampler {
 public:
  TrainSampler(const TokenStream& stream, uint64_t seed, int seq_len);
  // `weights` (>= 0, not all 0) are the streams' shares of the samples.
  TrainSampler(std::vector<const TokenStream*> streams, const std::vector<double>& weights, uint64_t seed,
               int seq_len);
  // Fills inputs/targets (B*T each) with samples first_sample .. first_sample + B - 1.
  void fill(int64_t first_sample, int batch, int32_t* inputs, int32_t* targets) const;
  const SourceBlend& blend() const { return blend_; }

 private:
  std::vector<const TokenStream*> streams_;
  SourceBlend blend_;
  uint64_t seed_;
  int seq_len_;
};

// Validation windows: a fixed set, consecutive non-overlapping windows from the stream's start.
class ValSampler {
 public:
  // Throws UserError (naming `key`) if the stream is shorter than batches * B * T + 1 tokens.
  ValSampler(const TokenStream& stream, const std::string& key, int batches, int batch, int seq_len);
  int batches() const { return batches_; }
  void fill(int batch_index, int32_t* inputs, int32_t* targets) const;

 private:
  const TokenStream& stream_;
  int batches_, batch_, seq_len_;
};

}  // namespace ptrain
