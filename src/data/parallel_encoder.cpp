#include "data/parallel_encoder.h"

#include <omp.h>

#include <algorithm>
#include <exception>

namespace ptrain {

namespace {

// Parts below this size are not worth a thread.
constexpr size_t kMinPartBytes = 1 << 16;

}  // namespace

ParallelEncoder::ParallelEncoder(const Tokenizer& tokenizer, int threads)
    : tokenizer_(tokenizer), threads_(std::max(1, threads)) {
  if (tokenizer.bpe())
    for (int t = 0; t < threads_; ++t) encoders_.emplace_back(*tokenizer.bpe(), *tokenizer.pretokenizer());
}

void ParallelEncoder::encode(std::string_view text, std::vector<uint32_t>& out) {
  if (!tokenizer_.bpe()) {
    for (const char c : text) out.push_back(static_cast<unsigned char>(c));
    return;
  }
  // Parts of about equal size, each starting at a safe place; a few per thread so that a slow
  // part (long pieces) does not hold up the rest.
  const size_t wanted = std::max<size_t>(1, std::min<size_t>(4 * threads_, text.size() / kMinPartBytes));
  std::vector<size_t> cuts = {0};
  for (size_t k = 1; k < wanted; ++k) {
    const size_t cut = tokenizer_.pretokenizer()->safe_cut(text, std::max(cuts.back() + 1, text.size() * k / wanted));
    if (cut >= text.size()) break;
    cuts.push_back(cut);
  }
  cuts.push_back(text.size());
  const int parts = static_cast<int>(cuts.size()) - 1;
  parts_.resize(static_cast<size_t>(parts));
  // An exception may not leave a parallel region: the first one is kept and thrown after it.
  std::exception_ptr failure;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads_)
  for (int p = 0; p < parts; ++p) {
    parts_[p].ids.clear();
    try {
      parts_[p].ids.reserve((cuts[p + 1] - cuts[p]) / 2);  // text has fewer ids than half its bytes, mostly
      encoders_[omp_get_thread_num()].encode(text.substr(cuts[p], cuts[p + 1] - cuts[p]), parts_[p].ids);
    } catch (...) {
#pragma omp critical(parallel_encoder_failure)
      if (!failure) failure = std::current_exception();
    }
  }
  if (failure) std::rethrow_exception(failure);
  for (int p = 0; p < parts; ++p) out.insert(out.end(), parts_[p].ids.begin(), parts_[p].ids.end());
}

size_t ParallelEncoder::settled_prefix(std::string_view text) const {
  if (!tokenizer_.bpe()) return text.size();
  // The last safe place: look in the last 64 KiB, then in ever longer tails.
  for (size_t tail = 1 << 16;; tail *= 4) {
    const size_t from = text.size() > tail ? text.size() - tail : 0;
    size_t last = 0;
    for (size_t cut = tokenizer_.pretokenizer()->safe_cut(text, from); cut < text.size(); cut = tokenizer_.pretokenizer()->safe_cut(text, cut + 1)) last = cut;
    if (last > 0 || from == 0) return last;
  }
}

}  // namespace ptrain
