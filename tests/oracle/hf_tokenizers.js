// Hugging Face's tokenizers (the Rust library's node binding, npm tokenizers) as the oracle for
// the tokenizer.json files ptrain's exports write. The package is in the cache
// scripts/fetch-data.sh fills.
//   node hf_tokenizers.js strings TOKENIZER.json IN.json OUT.json
//       each string of a JSON array -> its ids, as Tokenizer.fromFile(TOKENIZER.json) encodes
//       it without added special tokens
//   node hf_tokenizers.js documents TOKENIZER.json ID OUT.bin FILE...
//       token ID + the ids of each file, as uint32 (as ptrain's shards of a 128k vocabulary)
//   node hf_tokenizers.js roundtrip TOKENIZER.json IN.json OUT.json
//       each string -> whether decoding its ids gives it back
//   RAYON_NUM_THREADS=N [HF_TOKENIZER_JSON=FILE] node hf_tokenizers.js bench FILE...
//       MB/s of encodeBatch over the files (one sequence each) on N threads, median of 5, with
//       the tokenizer.json named, else GPT-2's tokenizer as Hugging Face builds it from OpenAI's
//       files (the cache's gpt2-hf/)
'use strict';
const fs = require('fs');
const path = require('path');
const os = require('os');

const cache = process.env.PTRAIN_CACHE || path.join(os.homedir(), '.cache', 'ptrain');
const { Tokenizer, BPE, byteLevelPreTokenizer } = require(path.join(cache, 'hf-tokenizers', 'index.js'));
const [mode, ...args] = process.argv.slice(2);

async function main() {
  if (mode === 'strings') {
    const tokenizer = Tokenizer.fromFile(args[0]);
    const strings = JSON.parse(fs.readFileSync(args[1], 'utf8'));
    const encodings = await tokenizer.encodeBatch(strings, { addSpecialTokens: false });
    fs.writeFileSync(args[2], JSON.stringify(encodings.map((e) => e.getIds())));
  } else if (mode === 'documents') {
    const tokenizer = Tokenizer.fromFile(args[0]);
    const out = fs.openSync(args[2], 'w');
    for (const file of args.slice(3)) {
      const encoding = await tokenizer.encode(fs.readFileSync(file, 'utf8'), null, { addSpecialTokens: false });
      fs.writeSync(out, Buffer.from(Uint32Array.from([Number(args[1]), ...encoding.getIds()]).buffer));
    }
    fs.closeSync(out);
  } else if (mode === 'roundtrip') {
    const tokenizer = Tokenizer.fromFile(args[0]);
    const strings = JSON.parse(fs.readFileSync(args[1], 'utf8'));
    const encodings = await tokenizer.encodeBatch(strings, { addSpecialTokens: false });
    const texts = await tokenizer.decodeBatch(encodings.map((e) => e.getIds()), false);
    fs.writeFileSync(args[2], JSON.stringify(texts.map((t, i) => t === strings[i])));
  } else if (mode === 'bench') {
    let tokenizer;
    if (process.env.HF_TOKENIZER_JSON) {
      tokenizer = Tokenizer.fromFile(process.env.HF_TOKENIZER_JSON);
    } else {
      const hf = path.join(cache, 'gpt2-hf');
      tokenizer = new Tokenizer(await BPE.fromFile(path.join(hf, 'vocab.json'), path.join(hf, 'merges.txt')));
      tokenizer.setPreTokenizer(byteLevelPreTokenizer(false, true));
    }
    const texts = args.map((f) => fs.readFileSync(f, 'utf8'));
    const bytes = texts.reduce((n, t) => n + Buffer.byteLength(t), 0);
    const rates = [];
    for (let i = 0; i < 5; ++i) {
      const t0 = process.hrtime.bigint();
      await tokenizer.encodeBatch(texts, { addSpecialTokens: false });
      rates.push(bytes / 1e6 / (Number(process.hrtime.bigint() - t0) / 1e9));
    }
    rates.sort((a, b) => a - b);
    console.log(rates[2].toFixed(2));
  } else {
    throw new Error(`unknown mode ${mode}; expected strings, documents, roundtrip or bench`);
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
