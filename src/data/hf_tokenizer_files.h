// ptrain's tokenizers written as Hugging Face's tokenizer files, for a model export. GPT-2's:
// vocab.json (each token's bytes spelled by gpt2_byte_to_unicode, mapped to its id) and
// merges.txt (one "left right" pair per merge, in priority order), which
// BpeVocabulary::from_hf_files reads back to the same vocabulary, and tokenizer.json, the one
// file fast tokenizers load (a byte-level BPE model of the same vocabulary and merges, with
// GPT-2's pre-tokenizer pattern). The bytes tokenizer's tokenizer.json is byte-level BPE
// without merges: each byte its own id.
#pragma once

#include <map>
#include <string>

#include "data/bpe_vocabulary.h"
#include "data/tokenizer.h"

namespace ptrain {

std::string bpe_vocab_json(const BpeVocabulary& vocabulary);
// Each merge is recovered from the priorities alone (a tiktoken file has no merge list): a
// token's two halves are what byte-pair encoding of its bytes leaves when only the merges of
// higher priority may apply.
std::string bpe_merges_txt(const BpeVocabulary& vocabulary);
// tokenizer_config.json for GPT2Tokenizer, with <|endoftext|> as bos, eos and unk.
std::string gpt2_tokenizer_config(int model_max_length);
// tokenizer.json from the vocabulary's vocab.json and merges.txt (as the functions above write
// them: the merges take a while to recover), with token `end_of_text` <|endoftext|> an added
// special token, as in GPT-2's own file.
std::string gpt2_tokenizer_json(const std::string& vocab_json, const std::string& merges_txt, uint32_t end_of_text);
// special_tokens_map.json: <|endoftext|> as bos, eos and unk.
std::string gpt2_special_tokens_map();

// A tiktoken encoding's tokenizer.json (cl100k_base, o200k_base): vocab.json and merges.txt as
// above (holes left out), its special tokens as added tokens, a Split by its pattern before
// ByteLevel, and ignore_merges, as tiktoken merges.
std::string tiktoken_tokenizer_json(const std::string& vocab_json, const std::string& merges_txt,
                                    const BpeVocabulary& vocabulary, const std::string& pattern);
// tokenizer_config.json for PreTrainedTokenizerFast, and special_tokens_map.json, with the
// token that marks documents (if any) as bos and eos.
std::string fast_tokenizer_config(int model_max_length, const std::string& document_token);
std::string special_tokens_map(const std::string& document_token);

// The bytes tokenizer's tokenizer.json: byte-level BPE without merges.
std::string bytes_tokenizer_json();

// Every file of a Hugging Face directory that describes `tokenizer`: tokenizer.json (a
// tokenizer.json ptrain read is copied, checked against the hash it was read with),
// tokenizer_config.json and special_tokens_map.json, and for gpt2 also vocab.json and
// merges.txt; `end_of_text` the id config.json names (-1: none). A `model_max_length` of 0
// leaves it out of tokenizer_config.json.
struct HfTokenizerFiles {
  std::map<std::string, std::string> files;  // by file name
  int end_of_text = -1;
};
HfTokenizerFiles hf_tokenizer_files(const Tokenizer& tokenizer, int model_max_length);

}  // namespace ptrain
