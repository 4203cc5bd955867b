// GPT-2's vocabulary written as Hugging Face's tokenizer files, for a model export: vocab.json
// (each token's bytes spelled by gpt2_byte_to_unicode, mapped to its id) and merges.txt (one
// "left right" pair per merge, in priority order). Gpt2Vocabulary::from_hf_files reads them
// back to the same vocabulary.
#pragma once

#include <string>

#include "data/gpt2_vocabulary.h"

namespace ptrain {

std::string gpt2_vocab_json(const Gpt2Vocabulary& vocabulary);
// Each merge is recovered from the priorities alone (a tiktoken file has no merge list): a
// token's two halves are what byte-pair encoding of its bytes leaves when only the merges of
// higher priority may apply.
std::string gpt2_merges_txt(const Gpt2Vocabulary& vocabulary);
// tokenizer_config.json for GPT2Tokenizer, with <|endoftext|> as bos, eos and unk.
std::string gpt2_tokenizer_config(int model_max_length);

}  // namespace ptrain
