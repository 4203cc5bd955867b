#include "data/bpe_encoder.h"

#include <cstring>
#include <queue>

#include "core/error.h"
#include "data/cl100k_pieces.h"
#include "data/gpt2_pieces.h"
#include "data/o200k_pieces.h"

namespace ptrain {

namespace {

constexpr size_t kScanLimit = 128;        // longer pieces merge by priority queue
constexpr size_t kCachedPieceBytes = 64;  // longer pieces are rare: not worth caching
constexpr size_t kCacheEntries = 1 << 18;
constexpr uint32_t kNone = BpeVocabulary::kNone;
constexpr int kRecentBits = 13;                    // 2^13 entries, 256 KiB
constexpr size_t kRecentTableFromBytes = 1 << 16;  // made at the first text this long

}  // namespace

BpeEncoder::BpeEncoder(const BpeVocabulary& vocabulary, const Pretokenizer& pretokenizer)
    : vocabulary_(vocabulary), pretokenizer_(pretokenizer) {
  if (pretokenizer.kind() == Pretokenizer::Kind::regex)
    regex_.emplace(pretokenizer.splits(), pretokenizer.regexes(), pretokenizer.prefix_space_at());
}

namespace {

// Calls `between(text)` for the text before, between and after the words of `words` found in
// `text`, and appends each word's id to `out`, in order.
template <typename F>
void split_at_words(const AddedWords& words, std::string_view text, std::vector<uint32_t>& out, F&& between) {
  if (words.empty()) {
    between(text);
    return;
  }
  for (size_t at = 0; at < text.size();) {
    const AddedWordMatch match = words.find(text, at);
    if (match.begin > at) between(text.substr(at, match.begin - at));
    if (match.begin == text.size()) break;
    out.push_back(match.id);
    at = match.end;
  }
}

}  // namespace

void BpeEncoder::encode(std::string_view original, std::vector<uint32_t>& out) {
  if (recent_.empty() && original.size() >= kRecentTableFromBytes) recent_.resize(size_t{1} << kRecentBits);
  split_at_words(pretokenizer_.raw_words(), original, out, [&](std::string_view part) {
    std::string normalized;
    if (!pretokenizer_.normalizer().empty()) normalized = normalize_text(part, pretokenizer_.normalizer());
    split_at_words(pretokenizer_.normalized_words(), pretokenizer_.normalizer().empty() ? part : normalized, out,
                   [&](std::string_view text) { encode_pieces(text, out); });
  });
}

void BpeEncoder::encode_pieces(std::string_view text, std::vector<uint32_t>& out) {
  const auto piece = [&](size_t begin, size_t end) { encode_piece(text.substr(begin, end - begin), out); };
  switch (pretokenizer_.kind()) {
    case Pretokenizer::Kind::gpt2: for_each_piece(text, gpt2_piece_end, piece); break;
    case Pretokenizer::Kind::cl100k: for_each_piece(text, cl100k_piece_end, piece); break;
    case Pretokenizer::Kind::o200k: for_each_piece(text, o200k_piece_end, piece); break;
    case Pretokenizer::Kind::regex:
      regex_->for_each(text, [&](std::string_view p) { encode_piece(p, out); });
      break;
  }
}

void BpeEncoder::encode_piece(std::string_view piece, std::vector<uint32_t>& out) {
  RecentPiece* recent = nullptr;
  RecentPiece key;
  if (!recent_.empty() && !piece.empty() && piece.size() <= kRecentPieceBytes) {  // (an empty entry is length 0)
    std::memcpy(key.words, piece.data(), piece.size());
    key.length = static_cast<uint32_t>(piece.size());
    // A multiplicative hash of the words; the top bits pick the entry.
    const uint64_t mixed = (key.words[0] * 0x9E3779B97F4A7C15) ^ (key.words[1] * 0xC2B2AE3D27D4EB4F) ^
                           (key.words[2] * 0x165667B19E3779F9) ^ key.length;
    recent = &recent_[(mixed * 0xFF51AFD7ED558CCD) >> (64 - kRecentBits)];
    if (recent->length == key.length && recent->words[0] == key.words[0] && recent->words[1] == key.words[1] &&
        recent->words[2] == key.words[2]) {
      out.push_back(recent->id);
      return;
    }
  }
  const size_t before = out.size();
  encode_uncached_piece(piece, out);
  if (recent && out.size() == before + 1) {
    key.id = out.back();
    *recent = key;
  }
}

void BpeEncoder::encode_uncached_piece(std::string_view piece, std::vector<uint32_t>& out) {
  const uint32_t whole = vocabulary_.whole_pieces_first() ? vocabulary_.id(piece) : kNone;
  if (whole != kNone) {
    out.push_back(whole);
    return;
  }
  if (piece.size() > kScanLimit) {
    merge_by_queue(piece, out);
    return;
  }
  if (piece.size() > kCachedPieceBytes) {
    merge_by_scan(piece, out);
    return;
  }
  auto found = cache_.find(std::string(piece));
  if (found == cache_.end()) {
    if (cache_.size() >= kCacheEntries) cache_.clear();
    std::vector<uint32_t> ids;
    merge_by_scan(piece, ids);
    found = cache_.emplace(std::string(piece), std::move(ids)).first;
  }
  out.insert(out.end(), found->second.begin(), found->second.end());
}

void BpeEncoder::merge_by_scan(std::string_view piece, std::vector<uint32_t>& out) const {
  // starts[i]: where part i begins; part i is piece[starts[i], starts[i + 1]).
  // joined[i]: the priority of parts i and i + 1 joined (kNone: not a token).
  const size_t n = piece.size();
  uint32_t starts[kScanLimit + 1];
  uint32_t joined[kScanLimit];
  std::vector<uint32_t> big_starts, big_joined;  // only for a piece longer than kScanLimit
  uint32_t* s = starts;
  uint32_t* p = joined;
  if (n > kScanLimit) {
    big_starts.resize(n + 1);
    big_joined.resize(n);
    s = big_starts.data();
    p = big_joined.data();
  }
  size_t parts = n;
  for (size_t i = 0; i <= n; ++i) s[i] = static_cast<uint32_t>(i);
  auto priority_of = [&](size_t i) {  // parts i and i + 1 joined
    if (i + 1 >= parts) return kNone;
    return vocabulary_.join_priority(piece.substr(s[i], s[i + 2] - s[i]), s[i + 1] - s[i]);
  };
  for (size_t i = 0; i + 1 < parts; ++i) p[i] = priority_of(i);
  while (parts > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < parts; ++i)
      if (p[i] < p[best]) best = i;
    if (p[best] == kNone) break;
    // Parts best and best + 1 become one: drop the boundary between them.
    for (size_t i = best + 1; i < parts; ++i) s[i] = s[i + 1];
    for (size_t i = best + 1; i + 1 < parts - 1; ++i) p[i] = p[i + 1];
    --parts;
    p[best] = priority_of(best);
    if (best > 0) p[best - 1] = priority_of(best - 1);
  }
  for (size_t i = 0; i < parts; ++i) {
    const uint32_t id = vocabulary_.id(piece.substr(s[i], s[i + 1] - s[i]));
    PTRAIN_CHECK(id != kNone, "a BPE part is not a token");
    out.push_back(id);
  }
}

void BpeEncoder::merge_by_queue(std::string_view piece, std::vector<uint32_t>& out) const {
  // Parts as a linked list over their first bytes; candidate joins in a queue ordered by
  // (priority, position), which is the scan's choice. A candidate is stale once either part
  // has changed: its recorded ends no longer match.
  const auto n = static_cast<uint32_t>(piece.size());
  std::vector<uint32_t> end(n), next(n), prev(n);
  std::vector<bool> alive(n, true);
  for (uint32_t i = 0; i < n; ++i) {
    end[i] = i + 1;
    next[i] = i + 1;  // n: none
    prev[i] = i == 0 ? n : i - 1;
  }
  struct Candidate {
    uint32_t priority, left, middle, right_end;
    bool operator>(const Candidate& o) const { return priority != o.priority ? priority > o.priority : left > o.left; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  auto offer = [&](uint32_t left) {
    if (left >= n || next[left] >= n) return;
    const uint32_t right = next[left];
    const uint32_t priority = vocabulary_.join_priority(piece.substr(left, end[right] - left), right - left);
    if (priority != kNone) queue.push({priority, left, right, end[right]});
  };
  for (uint32_t i = 0; i + 1 < n; ++i) offer(i);
  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    if (!alive[c.left] || next[c.left] != c.middle || end[c.left] != c.middle || end[c.middle] != c.right_end)
      continue;
    alive[c.middle] = false;
    end[c.left] = c.right_end;
    next[c.left] = next[c.middle];
    if (next[c.left] < n) prev[next[c.left]] = c.left;
    offer(c.left);
    if (prev[c.left] < n) offer(prev[c.left]);
  }
  for (uint32_t i = 0; i < n; i = next[i]) {
    const uint32_t id = vocabulary_.id(piece.substr(i, end[i] - i));
    PTRAIN_CHECK(id != kNone, "a BPE part is not a token");
    out.push_back(id);
  }
}

}  // namespace ptrain
