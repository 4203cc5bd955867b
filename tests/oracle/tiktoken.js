// tiktoken's WebAssembly build (npm tiktoken, the same Rust core as Python's tiktoken) as the
// oracle for ptrain's gpt2, cl100k_base and o200k_base tokenizers: the encoding is
// $TIKTOKEN_ENCODING, gpt2 when unset. The package is in the cache scripts/fetch-data.sh fills.
//   node tiktoken.js strings IN.json OUT.json  each string of a JSON array -> its ids (encode_ordinary)
//   node tiktoken.js bytes IN.bin OUT.json     a file's bytes decoded as node's TextDecoder does
//                                              (U+FFFD for invalid UTF-8) -> its ids
//   node tiktoken.js documents OUT.bin FILE... <|endoftext|> + ids of each file, as uint16, or
//                                              uint32 where ids pass 65,535 (as ptrain's shards)
//   node tiktoken.js bench FILE                MB/s of encode_ordinary over a file (median of 5)
'use strict';
const fs = require('fs');
const path = require('path');
const os = require('os');

const cache = process.env.PTRAIN_CACHE || path.join(os.homedir(), '.cache', 'ptrain');
const { get_encoding } = require(path.join(cache, 'tiktoken', 'tiktoken.cjs'));
const enc = get_encoding(process.env.TIKTOKEN_ENCODING || 'gpt2');
const endOfText = enc.encode('<|endoftext|>', 'all')[0];
const wide = enc.encode('<|endoftext|>', 'all')[0] > 65535 || enc.token_byte_values().length > 65536;
const [mode, ...args] = process.argv.slice(2);

if (mode === 'strings') {
  const strings = JSON.parse(fs.readFileSync(args[0], 'utf8'));
  fs.writeFileSync(args[1], JSON.stringify(strings.map((s) => Array.from(enc.encode_ordinary(s)))));
} else if (mode === 'bytes') {
  const text = new TextDecoder('utf-8').decode(fs.readFileSync(args[0]));
  fs.writeFileSync(args[1], JSON.stringify(Array.from(enc.encode_ordinary(text))));
} else if (mode === 'documents') {
  const out = fs.openSync(args[0], 'w');
  for (const file of args.slice(1)) {
    const Ids = wide ? Uint32Array : Uint16Array;
    const ids = Ids.from([endOfText, ...enc.encode_ordinary(fs.readFileSync(file, 'utf8'))]);
    fs.writeSync(out, Buffer.from(ids.buffer));
  }
  fs.closeSync(out);
} else if (mode === 'bench') {
  const text = fs.readFileSync(args[0], 'utf8');
  const rates = [];
  for (let i = 0; i < 5; ++i) {
    const t0 = process.hrtime.bigint();
    enc.encode_ordinary(text);
    rates.push(Buffer.byteLength(text) / 1e6 / (Number(process.hrtime.bigint() - t0) / 1e9));
  }
  rates.sort((a, b) => a - b);
  console.log(rates[2].toFixed(2));
} else {
  console.error('usage: tiktoken.js strings|bytes|documents|bench ...');
  process.exit(2);
}
enc.free();
