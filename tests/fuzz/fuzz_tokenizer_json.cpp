// Hugging Face's tokenizer.json as ptrain reads it (any bytes: the JSON, the model, the
// pre-tokenizer's Splits, the normalizer): refused with a UserError, or a tokenizer that encodes
// text into ids of its vocabulary which decode back to the text (normalized, where it says so;
// less what a Split removes, where one does; with a space before it, where ByteLevel puts one).
#include <algorithm>
#include <string>
#include <vector>

#include "data/bpe_encoder.h"
#include "data/hf_tokenizer_json.h"
#include "data/pretokenizer.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const ptrain::fuzz::MemoryFile file(data, size);
  ptrain::TokenizerJson t;
  if (!ptrain::fuzz::accepted([&] { t = ptrain::read_tokenizer_json(file.path(), ""); })) return 0;
  ptrain::Pretokenizer pretokenizer;
  if (!ptrain::fuzz::accepted([&] {
        pretokenizer = ptrain::Pretokenizer::from_splits(t.splits, "fuzz", t.normalizer, t.prefix_space_at)
                           .with_added_words(t.raw_words, t.normalized_words);
      }))
    return 0;
  const auto is_word = [&](uint32_t id) {
    for (const ptrain::AddedWords* words : {&t.raw_words, &t.normalized_words})
      for (const ptrain::AddedToken& w : words->words())
        if (w.id == id) return true;
    return false;
  };
  const std::string text = "Hello, world's 12345 caf\xC3\xA9 \xEF\xAC\x81 \xE4\xB8\xAD\n\n  x";
  std::vector<uint32_t> ids;
  ptrain::BpeEncoder(*t.vocabulary, pretokenizer).encode(text, ids);
  std::string decoded;
  for (const uint32_t id : ids) {
    if (!t.vocabulary->has(id) || (t.vocabulary->is_special(id) && !is_word(id)))
      throw std::logic_error("an id outside the vocabulary, or a special token's");
    decoded += t.vocabulary->bytes(id);
  }
  const std::string normalized = ptrain::normalize_text(text, t.normalizer);
  const bool removes = std::any_of(t.splits.begin(), t.splits.end(), [](const ptrain::SplitRule& r) {
    return r.behavior == ptrain::SplitBehavior::removed;
  });
  // A word decodes to its text as given: under a normalizer it may not be what matched.
  const bool words = !(t.raw_words.empty() && t.normalized_words.empty());
  if (words && !t.normalizer.empty()) return 0;
  // A prefix space before the Splits is one space before the text (between words, one each).
  if (t.prefix_space_at != ptrain::kNoPrefixSpace) {
    if (t.prefix_space_at == 0 && !words && !removes &&
        decoded != (normalized.empty() || normalized[0] == ' ' ? normalized : " " + normalized))
      throw std::logic_error("decode(encode(x)) is not the text with a space before it");
    return 0;
  }
  if (removes ? decoded.size() > normalized.size() : decoded != normalized)
    throw std::logic_error("decode(encode(x)) is not the text, less what a Split removes");
  return 0;
}
