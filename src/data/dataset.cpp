#include "data/dataset.h"

#include <algorithm>

#include "core/error.h"
#include "core/rng.h"

namespace ptrain {

namespace {

// Inputs are tokens [start, start + T) of a window of T + 1, targets the same shifted by one.
void split_window(const std::vector<int32_t>& window, int seq_len, int32_t* inputs, int32_t* targets) {
  std::copy(window.begin(), window.begin() + seq_len, inputs);
  std::copy(window.begin() + 1, window.end(), targets);
}

}  // namespace

TokenStream::TokenStream(const std::vector<std::string>& files, const std::string& key, int vocab_size)
    : files_(files), key_(key), vocab_size_(vocab_size) {
  shards_.reserve(files_.size());
  for (const std::string& file : files_) {
    try {
      shards_.emplace_back(file);
    } catch (const UserError& e) {
      throw UserError(key + ": " + e.what());
    }
    // One split of one tokenizer: a width that changes between its shards means shards made
    // for two vocabularies.
    const TokenShard& first = shards_.front();
    if (&shards_.back().format() != &first.format())
      throw UserError(key + ": \"" + file + "\" is in " + shards_.back().format().name + " but \"" + first.path() +
                      "\" is in " + first.format().name + "; expected the shards of one vocabulary, in one format");
    starts_.push_back(total_);
    total_ += shards_.back().size();
  }
}

const ShardFormat& TokenStream::format() const {
  PTRAIN_CHECK(!shards_.empty(), "a token stream without shards has no format");
  return shards_.front().format();
}

void TokenStream::copy(int64_t pos, int64_t n, int32_t* out) const {
  PTRAIN_CHECK(pos >= 0 && n >= 0 && pos + n <= total_, "token range outside the stream");
  if (n == 0) return;
  // The last shard starting at or before pos holds it (an empty shard shares the next start).
  size_t s = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), pos) - starts_.begin()) - 1;
  int64_t offset = pos - starts_[s];
  std::vector<uint32_t> part;
  while (n > 0) {
    const int64_t take = std::min(n, shards_[s].size() - offset);
    part.resize(static_cast<size_t>(take));
    try {
      shards_[s].read(offset, take, part.data());
    } catch (const UserError& e) {
      throw UserError(key_ + ": " + e.what());
    }
    // An out-of-range token would index past the embedding table.
    for (int64_t i = 0; i < take; ++i) {
      if (part[i] >= static_cast<uint32_t>(vocab_size_))
        throw UserError(key_ + ": token id " + std::to_string(part[i]) + " at position " + std::to_string(offset + i) +
                        " of \"" + shards_[s].path() + "\" is not below model.vocab_size " + std::to_string(vocab_size_) +
                        "; expected shards made with this model's vocabulary");
      out[i] = static_cast<int32_t>(part[i]);
    }
    out += take;
    n -= take;
    offset = 0;
    ++s;
  }
}

TrainSampler::TrainSampler(const TokenStream& stream, uint64_t seed, int seq_len)
    : TrainSampler({&stream}, {1.0}, seed, seq_len) {}

TrainSampler::TrainSampler(std::vector<const TokenStream*> streams, const std::vector<double>& weights, uint64_t seed,
                           int seq_len)
    : streams_(std::move(streams)), blend_(weights), seed_(seed), seq_len_(seq_len) {
  PTRAIN_CHECK(seq_len > 0, "sequence length must be positive");
  PTRAIN_CHECK(streams_.size() == weights.size(), "one weight per stream");
  for (const TokenStream* stream : streams_)
    if (stream->size() < static_cast<int64_t>(seq_len) + 1)
      throw UserError(stream->key() + ": the training data has " + std::to_string(stream->size()) +
                      " tokens, expected at least seq_len + 1 = " + std::to_string(seq_len + 1) +
                      " for one training window (lower training.seq_len or add data)");
}

void TrainSampler::fill(int64_t first_sample, int batch, int32_t* inputs, int32_t* targets) const {
  PTRAIN_CHECK(first_sample >= 0 && batch >= 0, "sample indices must be non-negative");
  std::vector<int32_t> window(static_cast<size_t>(seq_len_) + 1);
  for (int b = 0; b < batch; ++b) {
    const int64_t sample = first_sample + b;
    const TokenStream& stream = *streams_[static_cast<size_t>(blend_.source_of(sample))];
    const uint64_t starts = static_cast<uint64_t>(stream.size() - seq_len_);
    const int64_t start = static_cast<int64_t>(hash_combine(seed_, static_cast<uint64_t>(sample)) % starts);
    stream.copy(start, seq_len_ + 1, window.data());
    split_window(window, seq_len_, inputs + static_cast<int64_t>(b) * seq_len_, targets + static_cast<int64_t>(b) * seq_len_);
  }
}

ValSampler::ValSampler(const TokenStream& stream, const std::string& key, int batches, int batch,
                       int seq_len)
    : stream_(stream), batches_(batches), batch_(batch), seq_len_(seq_len) {
  PTRAIN_CHECK(batches > 0 && batch > 0 && seq_len > 0, "validation shape must be positive");
  const int64_t needed = static_cast<int64_t>(batches) * batch * seq_len + 1;
  if (stream.size() < needed)
    throw UserError(key + ": the validation data has " + std::to_string(stream.size()) +
                    " tokens, expected at least " + std::to_string(needed) + " (eval_batches " +
                    std::to_string(batches) + " x micro_batch " + std::to_string(batch) +
                    " x seq_len " + std::to_string(seq_len) +
                    " + 1); lower training.eval_batches or training.micro_batch");
}

void ValSampler::fill(int batch_index, int32_t* inputs, int32_t* targets) const {
  PTRAIN_CHECK(batch_index >= 0 && batch_index < batches_, "validation batch index out of range");
  std::vector<int32_t> window(static_cast<size_t>(seq_len_) + 1);
  for (int b = 0; b < batch_; ++b) {
    const int64_t row = static_cast<int64_t>(batch_index) * batch_ + b;
    stream_.copy(row * seq_len_, seq_len_ + 1, window.data());
    split_window(window, seq_len_, inputs + static_cast<int64_t>(b) * seq_len_, targets + static_cast<int64_t>(b) * seq_len_);
  }
}

}  // namespace ptrain
