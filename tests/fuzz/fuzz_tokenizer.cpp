// GPT-2's tokenizer on any bytes: invalid UTF-8 is refused (UserError) or replaced into valid
// UTF-8; valid text encodes to ids inside the vocabulary that decode back to it, the two merge
// procedures agree on every piece, and a cut at a safe place changes no id.
#include <string>
#include <string_view>
#include <vector>

#include "data/gpt2_encoder.h"
#include "data/gpt2_pieces.h"
#include "data/tokenizer.h"
#include "core/utf8.h"
#include "fuzz_util.h"

namespace {

const ptrain::Tokenizer& gpt2() {
  static const ptrain::Tokenizer t = ptrain::Tokenizer::load("gpt2");  // the vocabulary fetch-data.sh fetched
  return t;
}

void fail(const char* what) { throw std::logic_error(what); }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  std::string text = input;
  if (ptrain::first_invalid_utf8(input) != ptrain::kValidUtf8) {
    if (ptrain::fuzz::accepted([&] { gpt2().encode(input, "input"); })) fail("invalid UTF-8 was encoded");
    text = ptrain::replace_invalid_utf8(input);
    if (ptrain::first_invalid_utf8(text) != ptrain::kValidUtf8) fail("replacement left invalid UTF-8");
  }
  const std::vector<uint16_t> ids = gpt2().encode(text, "input");
  std::vector<int32_t> as_int(ids.begin(), ids.end());
  for (const int32_t id : as_int)
    if (id >= gpt2().vocab_size() || id == gpt2().end_of_text()) fail("an id outside the text vocabulary");
  if (gpt2().decode(as_int) != text) fail("decode(encode(x)) != x");

  ptrain::Gpt2Encoder encoder(*gpt2().gpt2());
  ptrain::for_each_gpt2_piece(text, [&](size_t begin, size_t end) {
    std::vector<uint16_t> scan, queue;
    encoder.merge_by_scan(std::string_view(text).substr(begin, end - begin), scan);
    encoder.merge_by_queue(std::string_view(text).substr(begin, end - begin), queue);
    if (scan != queue) fail("merging by scan and by queue disagree");
  });
  const size_t cut = ptrain::gpt2_safe_cut(text, text.size() / 2);
  if (cut < text.size()) {
    std::vector<uint16_t> parts = gpt2().encode(text.substr(0, cut), "left");
    const std::vector<uint16_t> right = gpt2().encode(text.substr(cut), "right");
    parts.insert(parts.end(), right.begin(), right.end());
    if (parts != ids) fail("a safe cut changed the ids");
  }
  return 0;
}
