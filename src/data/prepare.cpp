#include "data/prepare.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "core/error.h"
#include "core/format.h"
#include "core/huge_pages.h"
#include "core/input_file.h"
#include "core/output_file.h"
#include "core/paths.h"
#include "data/parallel_encoder.h"
#include "data/shard.h"
#include "data/tokenizer.h"
#include "data/tokenizer_record.h"
#include "core/utf8.h"

namespace ptrain {

namespace fs = std::filesystem;

namespace {

constexpr size_t kReadBytes = 2 << 20;  // text read per step, per thread
// More than this much text of one document with no place to cut it is refused: it would all
// have to be held in memory as one piece (a file of one letter repeated, say).
constexpr size_t kMaxUncutBytes = 256 << 20;
constexpr int64_t kCopyTokens = 1 << 20;
constexpr const char* kStaging = ".prepare-partial";

using Clock = std::chrono::steady_clock;

std::string in_quotes(const std::string& s) { return "\"" + s + "\""; }

// The files a list of inputs names: files as given, directories' regular files below them
// (hidden ones skipped), each directory's sorted by path.
std::vector<std::string> input_files(const std::vector<std::string>& inputs) {
  std::vector<std::string> files;
  for (const std::string& input : inputs) {
    const PathKind kind = path_kind(input, "--input");
    if (kind == PathKind::missing) throw UserError("--input " + in_quotes(input) + ": no such file or directory");
    if (kind != PathKind::directory) {
      files.push_back(input);
      continue;
    }
    std::vector<std::string> found;
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(input, ec); !ec && it != fs::recursive_directory_iterator();
         it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (!name.empty() && name[0] == '.') {
        if (it->is_directory()) it.disable_recursion_pending();
        continue;
      }
      if (it->is_regular_file()) found.push_back(it->path().string());
    }
    if (ec) throw UserError("--input " + in_quotes(input) + ": cannot list the directory: " + ec.message());
    if (found.empty()) throw UserError("--input " + in_quotes(input) + ": the directory holds no files");
    std::sort(found.begin(), found.end());
    files.insert(files.end(), found.begin(), found.end());
  }
  return files;
}

std::string shard_base_name(const std::string& out_dir) {
  fs::path p = fs::path(out_dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  const std::string name = fs::absolute(p).lexically_normal().filename().string();
  if (name.empty() || name == "." || name == "..")
    throw UserError("--out " + in_quotes(out_dir) + ": expected a directory with a name (the shards are named after it)");
  return name;
}

void check_options(const PrepareOptions& o) {
  if (o.inputs.empty()) throw UserError("--input: expected at least one file or directory");
  if (o.val_tokens < 0) throw UserError("--val-tokens is " + std::to_string(o.val_tokens) + ", expected 1 or more");
  if (o.val_tokens == 0 && !(o.val_fraction > 0 && o.val_fraction < 1))
    throw UserError("--val-fraction is " + number_text(o.val_fraction) +
                    ", expected a fraction strictly between 0 and 1");
  if (o.shard_tokens < 1 || o.shard_tokens > INT32_MAX)
    throw UserError("--shard-tokens is " + std::to_string(o.shard_tokens) +
                    ", expected 1..2147483647 (the shard header's int32 count)");
  if (o.threads < 0 || o.threads > kMaxPrepareThreads)
    throw UserError("--threads is " + std::to_string(o.threads) + ", expected 0 (all cores) to " +
                    std::to_string(kMaxPrepareThreads));
  if (o.tokenizer == "bytes" && !o.separator.empty())
    throw UserError("--separator: the bytes tokenizer has no end-of-text token to mark documents with");
  if (o.tokenizer != "bytes" && first_invalid_utf8(o.separator) != kValidUtf8)
    throw UserError("--separator: not valid UTF-8; expected text, as the " + o.tokenizer +
                    " tokenizer reads the documents as text");
  if (o.tokenizer == "bytes" && o.replace_invalid_utf8)
    throw UserError("--invalid-utf8 replace: the bytes tokenizer takes any bytes as they are");
}

// The output directory must be new or empty: shards of an earlier run beside new ones would
// be read together by a glob. The one thing it may hold is the staging directory of a prepare
// that was killed (its guard never ran): true is returned, and the caller removes it.
bool check_out_dir(const std::string& out_dir) {
  const PathKind kind = path_kind(out_dir, "--out");
  if (kind == PathKind::file || kind == PathKind::other)
    throw UserError("--out " + in_quotes(out_dir) + " exists and is not a directory; expected a new or empty directory");
  bool leftover = false;
  if (kind == PathKind::directory) {
    std::error_code ec;
    std::vector<std::string> names;
    for (fs::directory_iterator it(out_dir, ec), end; !ec && it != end; it.increment(ec))
      names.push_back(it->path().filename().string());
    if (ec) throw UserError("--out " + in_quotes(out_dir) + ": cannot list it (" + ec.message() + ")");
    std::sort(names.begin(), names.end());
    leftover = names.size() == 1 && names[0] == kStaging && path_kind((fs::path(out_dir) / kStaging).string(),
                                                                       "--out") == PathKind::directory;
    if (!names.empty() && !leftover) {
      std::string shown;
      for (size_t i = 0; i < names.size() && i < 3; ++i) shown += (i ? ", " : "") + in_quotes(names[i]);
      throw UserError("--out " + in_quotes(out_dir) + " is not empty (it holds " + shown +
                      (names.size() > 3 ? " and " + std::to_string(names.size() - 3) + " more" : std::string()) +
                      "); expected a new or empty directory");
    }
    check_writable_dir(out_dir, "--out");
  }
  check_creatable(out_dir, "--out", 64);
  return leftover;
}

// One line on stderr, rewritten in place, at most every half second.
class Progress {
 public:
  Progress(bool enabled, int64_t total) : enabled_(enabled), total_(total), start_(Clock::now()) {}
  void update(int64_t done) {
    if (!enabled_) return;
    const auto now = Clock::now();
    if (now - last_ < std::chrono::milliseconds(500) && done < total_) return;
    last_ = now;
    const double s = std::chrono::duration<double>(now - start_).count();
    const double rate = s > 0 ? static_cast<double>(done) / s : 0;
    const double eta = rate > 0 ? static_cast<double>(total_ - done) / rate : 0;
    const int width = 30;
    const int filled = total_ > 0 ? static_cast<int>(width * done / total_) : width;
    std::fprintf(stderr, "\r[%s%s] %6.1f / %.1f MB  %.1f MB/s  ETA %.0f s ", std::string(filled, '#').c_str(),
                 std::string(width - filled, '.').c_str(), done / 1e6, total_ / 1e6, rate / 1e6, eta);
    if (done >= total_) std::fprintf(stderr, "\n");
  }

 private:
  bool enabled_;
  int64_t total_;
  Clock::time_point start_, last_;
};

// Reads the inputs document by document and writes every token, in order, to one file.
class TokenWriter {
 public:
  TokenWriter(const PrepareOptions& o, const Tokenizer& tokenizer, const std::string& path, int64_t total_bytes)
      : o_(o), tokenizer_(tokenizer), format_(shard_format_for(tokenizer.vocab_size())),
        encoder_(tokenizer, o.threads > 0 ? o.threads : omp_get_max_threads()), out_(path),
        progress_(o.progress, total_bytes) {
    reserve_on_huge_pages(ids_, 2 * kCopyTokens);
    if (format_.token_bytes == 2) reserve_on_huge_pages(narrow_, 2 * kCopyTokens);
  }

  void add_file(const std::string& path) {
    const InputFile in(path, "input " + in_quotes(path));
    file_ = path;
    start_document();
    std::string buffer, raw;
    const size_t block = kReadBytes * static_cast<size_t>(encoder_.threads());
    reserve_on_huge_pages(raw, 2 * block);
    reserve_on_huge_pages(buffer, 2 * block);
    int64_t offset = 0;
    do {
      // raw: what was read and not yet moved to `buffer`; for BPE it is checked (or mended)
      // as UTF-8 first, less an incomplete character at its end, which waits for the next read.
      const size_t n = static_cast<size_t>(std::min<int64_t>(static_cast<int64_t>(block), in.size() - offset));
      const size_t old = raw.size();
      raw.resize(old + n);
      in.read_at(offset, raw.data() + old, n);
      const int64_t raw_offset = offset - static_cast<int64_t>(old);
      offset += static_cast<int64_t>(n);
      const bool at_end = offset == in.size();
      const size_t whole = tokenizer_.bpe() && !at_end ? complete_utf8_prefix(raw) : raw.size();
      const std::string_view text = std::string_view(raw).substr(0, whole);
      const size_t bad = tokenizer_.bpe() ? first_invalid_utf8(text) : kValidUtf8;
      if (bad == kValidUtf8) {
        buffer.append(text);
      } else if (o_.replace_invalid_utf8) {
        buffer.append(replace_invalid_utf8(text));
      } else {
        throw UserError("input " + in_quotes(path) + ": invalid UTF-8 at byte offset " +
                        std::to_string(raw_offset + static_cast<int64_t>(bad)) +
                        "; expected UTF-8 text (or --invalid-utf8 replace, which puts U+FFFD for each invalid "
                        "sequence, as Python's errors=\"replace\" does)");
      }
      raw.erase(0, whole);
      split_documents(buffer, at_end);
      progress_.update(done_bytes_ += static_cast<int64_t>(n));
    } while (offset < in.size());
  }

  int64_t finish() {
    flush_ids();
    out_.finish(false);
    return tokens_;
  }
  int64_t documents() const { return documents_; }

 private:
  // `buffer` holds text of the current file not yet tokenized. Documents end at separators;
  // the text after the last one waits for more unless the file is at its end.
  void split_documents(std::string& buffer, bool at_end) {
    size_t begin = 0;
    if (!o_.separator.empty()) {
      for (size_t hit = buffer.find(o_.separator); hit != std::string::npos;
           hit = buffer.find(o_.separator, begin)) {
        encode_text(std::string_view(buffer).substr(begin, hit - begin), true);
        begin = hit + o_.separator.size();
        start_document();
      }
    }
    std::string_view rest = std::string_view(buffer).substr(begin);
    size_t used = rest.size();
    if (!at_end) {
      // Text that may be the start of a separator split by the read waits for the next read
      // (from a character's start: the text before it is tokenized now).
      if (!o_.separator.empty()) {
        used -= std::min(used, o_.separator.size() - 1);
        while (used > 0 && (static_cast<uint8_t>(rest[used]) & 0xC0) == 0x80) --used;
      }
      used = encode_text(rest.substr(0, used), false);
    } else {
      encode_text(rest, true);
    }
    buffer.erase(0, at_end ? buffer.size() : begin + used);
  }

  // Encodes `text` of the current document, all of it when `complete`, else up to its last
  // place that no piece crosses; returns how much was consumed.
  size_t encode_text(std::string_view text, bool complete) {
    const size_t take = complete ? text.size() : encoder_.settled_prefix(text);
    if (take == 0 && text.size() > kMaxUncutBytes) {
      const Pretokenizer& p = *tokenizer_.pretokenizer();
      if (p.kind() == Pretokenizer::Kind::regex || !p.normalizer().empty())
        throw UserError("input " + in_quotes(file_) + ": a document of more than " +
                        std::to_string(kMaxUncutBytes >> 20) + " MiB; the " + tokenizer_.name() + " tokenizer " +
                        (!p.normalizer().empty()                    ? "normalizes its text"
                         : p.prefix_space_at() != kNoPrefixSpace ? "puts a space before each piece"
                                                                  : "runs its pattern on a regex engine") +
                        ", and so takes each document whole; expected smaller documents (--separator splits a "
                        "file into documents)");
      throw UserError("input " + in_quotes(file_) + ": " + std::to_string(text.size() >> 20) +
                      " MiB of text with no place to cut between " + tokenizer_.name() + " pieces; expected text (" +
                      (p.kind() == Pretokenizer::Kind::o200k
                           ? "o200k_base's pieces are cut only after a line break, and this is one line"
                           : "a run of one character class this long would be one piece") +
                      "; --separator splits a file into documents)");
    }
    if (take > 0 && document_pending_) {
      // A document's <|endoftext|> goes out with its first text: empty documents (an empty
      // file, separators side by side) add nothing.
      document_pending_ = false;
      ++documents_;
      if (tokenizer_.has_end_of_text()) ids_.push_back(tokenizer_.end_of_text());
    }
    encoder_.encode(text.substr(0, take), ids_);
    if (ids_.size() >= static_cast<size_t>(kCopyTokens)) flush_ids();
    return take;
  }

  void start_document() { document_pending_ = true; }

  // The token file holds ids as the shards will (uint16 where they fit).
  void flush_ids() {
    if (format_.token_bytes == 2) {
      narrow_.assign(ids_.begin(), ids_.end());
      out_.write(narrow_.data(), narrow_.size() * sizeof(uint16_t));
    } else {
      out_.write(ids_.data(), ids_.size() * sizeof(uint32_t));
    }
    tokens_ += static_cast<int64_t>(ids_.size());
    ids_.clear();
  }

  const PrepareOptions& o_;
  const Tokenizer& tokenizer_;
  const ShardFormat& format_;
  ParallelEncoder encoder_;
  OutputFile out_;
  Progress progress_;
  std::vector<uint32_t> ids_;
  std::vector<uint16_t> narrow_;
  std::string file_;
  bool document_pending_ = false;
  int64_t done_bytes_ = 0, tokens_ = 0, documents_ = 0;
};

// Tokens [begin, end) of the token file as shards <dir>/<name>_<split>_NNNNNN.bin.
void write_split(const InputFile& tokens, const ShardFormat& format, int64_t begin, int64_t end, const fs::path& dir,
                 const std::string& name, const std::string& split, int64_t shard_tokens,
                 std::vector<std::string>& files) {
  std::vector<char> buffer;
  const int64_t width = format.token_bytes;
  reserve_on_huge_pages(buffer, static_cast<size_t>(kCopyTokens * width));
  for (int64_t index = 0, pos = begin; pos < end; ++index, pos += shard_tokens) {
    const int64_t stop = std::min(end, pos + shard_tokens);
    char file[64];
    std::snprintf(file, sizeof(file), "_%s_%06lld.bin", split.c_str(), static_cast<long long>(index));
    files.push_back((dir / (name + file)).string());
    OutputFile out(files.back());
    int32_t header[kShardHeaderInts];
    fill_shard_header(header, format, stop - pos);
    out.write(header, sizeof(header));
    for (int64_t at = pos; at < stop; at += kCopyTokens) {
      const int64_t n = std::min(kCopyTokens, stop - at);
      buffer.resize(static_cast<size_t>(n * width));
      tokens.read_at(at * width, buffer.data(), buffer.size());
      out.write(buffer.data(), buffer.size());
    }
    out.finish();
  }
}

// Removes what the run wrote unless it completed: the staging directory, the shards already
// moved out of it, and the output directory if this run made it.
struct StagingGuard {
  fs::path staging, out;
  bool made_out = false, done = false;
  const std::vector<std::string>* moved = nullptr;
  ~StagingGuard() {
    if (done) return;
    std::error_code ec;
    fs::remove_all(staging, ec);
    if (moved)
      for (const std::string& f : *moved) fs::remove(f, ec);
    if (made_out) fs::remove(out, ec);
  }
};

}  // namespace

PrepareResult prepare_text(const PrepareOptions& o) {
  check_options(o);
  const Tokenizer tokenizer = Tokenizer::load(o.tokenizer, o.vocabulary);
  const std::vector<std::string> files = input_files(o.inputs);
  int64_t total_bytes = 0;
  for (const std::string& f : files) total_bytes += InputFile(f, "input " + in_quotes(f)).size();
  const std::string name = shard_base_name(o.out_dir);
  const bool leftover = check_out_dir(o.out_dir);

  const auto start = Clock::now();
  StagingGuard guard{fs::path(o.out_dir) / kStaging, fs::path(o.out_dir)};
  guard.made_out = path_kind(o.out_dir, "--out") == PathKind::missing;
  if (leftover) {
    std::error_code ec;
    fs::remove_all(guard.staging, ec);
    if (ec) throw EnvironmentError("cannot remove " + guard.staging.string() + ": " + ec.message());
    std::fprintf(stderr, "removed %s, left by a data prepare that was interrupted\n", guard.staging.c_str());
  }
  make_shard_dir(guard.staging.string());
  const std::string token_file = (guard.staging / "tokens.tmp").string();
  TokenWriter writer(o, tokenizer, token_file, total_bytes);
  for (const std::string& f : files) writer.add_file(f);
  const int64_t total = writer.finish();

  PrepareResult result;
  result.input_bytes = total_bytes;
  result.documents = writer.documents();
  result.val_tokens =
      o.val_tokens > 0 ? o.val_tokens : std::max<int64_t>(1, std::llround(o.val_fraction * static_cast<double>(total)));
  result.train_tokens = total - result.val_tokens;
  // A split needs an input token and a target token for even one training window.
  if (result.train_tokens < 2 || result.val_tokens < 2)
    throw UserError("the inputs give " + std::to_string(total) + " tokens, which with " +
                    (o.val_tokens > 0 ? "--val-tokens " + std::to_string(o.val_tokens)
                                      : "--val-fraction " + number_text(o.val_fraction)) +
                    " leaves " + std::to_string(std::max<int64_t>(0, result.train_tokens)) + " train and " +
                    std::to_string(result.val_tokens) +
                    " val tokens; expected at least 2 in each split (more text, or a smaller val split)");
  {
    const InputFile tokens(token_file, "token file " + in_quotes(token_file));
    std::vector<std::string> staged;
    const ShardFormat& format = shard_format_for(tokenizer.vocab_size());
    write_split(tokens, format, result.train_tokens, total, guard.staging, name, "val", o.shard_tokens, staged);
    write_split(tokens, format, 0, result.train_tokens, guard.staging, name, "train", o.shard_tokens, staged);
    write_tokenizer_record(guard.staging.string(), {tokenizer.name(), tokenizer.vocab_size(),
                                                    tokenizer.has_end_of_text() ? static_cast<int>(tokenizer.end_of_text()) : -1,
                                                    tokenizer.vocabulary_sha256()});
    // Shards first, the record last: a directory with the record is complete.
    guard.moved = &result.files;
    for (const std::string& f : staged) {
      result.files.push_back((fs::path(o.out_dir) / fs::path(f).filename()).string());
      rename_path(f, result.files.back());
    }
    rename_path((guard.staging / kTokenizerRecord).string(), (fs::path(o.out_dir) / kTokenizerRecord).string());
  }
  sync_directory(o.out_dir);
  guard.done = true;
  std::error_code ec;
  fs::remove_all(guard.staging, ec);
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return result;
}

}  // namespace ptrain
