// Hugging Face's tokenizers (the Rust library's node binding, npm tokenizers) as the oracle for
// the tokenizer.json files ptrain's exports write. The package is in the cache
// scripts/fetch-data.sh fills.
//   node hf_tokenizers.js strings TOKENIZER.json IN.json OUT.json
//       each string of a JSON array -> its ids, as Tokenizer.fromFile(TOKENIZER.json) encodes
//       it without added special tokens
'use strict';
const fs = require('fs');
const path = require('path');
const os = require('os');

const cache = process.env.PTRAIN_CACHE || path.join(os.homedir(), '.cache', 'ptrain');
const { Tokenizer } = require(path.join(cache, 'hf-tokenizers', 'index.js'));
const [mode, ...args] = process.argv.slice(2);

async function main() {
  if (mode !== 'strings') throw new Error(`unknown mode ${mode}; expected strings`);
  const tokenizer = Tokenizer.fromFile(args[0]);
  const strings = JSON.parse(fs.readFileSync(args[1], 'utf8'));
  const encodings = await tokenizer.encodeBatch(strings, { addSpecialTokens: false });
  fs.writeFileSync(args[2], JSON.stringify(encodings.map((e) => e.getIds())));
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
