// Writes the golden file of GPT-2 token ids (tests/fixtures/gpt2-golden.json) from tiktoken's
// WebAssembly build: edge cases of GPT-2's pre-tokenisation and merges, so that ptrain's
// tokenizer is checked against tiktoken also where node is not installed.
//   node tests/oracle/make_golden.js tests/fixtures/gpt2-golden.json
'use strict';
const fs = require('fs');
const path = require('path');
const os = require('os');

const cache = process.env.PTRAIN_CACHE || path.join(os.homedir(), '.cache', 'ptrain');
const { get_encoding } = require(path.join(cache, 'tiktoken', 'tiktoken.cjs'));
const enc = get_encoding('gpt2');

const cp = (n) => String.fromCodePoint(n);
const strings = [];
// White space, and characters that look like it but are not White_Space (U+180E, U+200B..D,
// U+2060, U+FEFF), each alone and in the contexts the pattern's branches see.
const spaces = [0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x20, 0x85, 0xa0, 0x1680, 0x180e, 0x2000, 0x2001, 0x2002, 0x2003,
  0x2004, 0x2005, 0x2006, 0x2007, 0x2008, 0x2009, 0x200a, 0x200b, 0x200c, 0x200d, 0x2028, 0x2029, 0x202f, 0x205f,
  0x2060, 0x3000, 0xfeff];
for (const s of spaces.map(cp)) {
  strings.push(s, `x${s}w`, `x ${s}w`, `x${s}${s}w`, `a${s} b`, `${s}\n`, `1${s}2`, `.${s}!`, `${s}'s`);
}
strings.push(
  "I'm", "you're", "they've", "we'll", "he'd", "it's", "don't", "'s", "'S", "'t", "'re", "'ve", "'m", "'ll", "'d",
  "O'Neil's", "rock'n'roll", " 's", "''s", "'ll've", "\u2019s curly", "x's", "?'s", "'1", "' s", "can't've", "'",
  "123", "1234567890", " 42", "3.14159", "1,000,000", "\u0663\u0664\u0665", "\u00bd", "\u216b", "\u00b2", "x2", "2x",
  "\ud83d\udc4d", "\ud83d\udc68\u200d\ud83d\udc69\u200d\ud83d\udc67\u200d\ud83d\udc66", "\ud83c\uddfa\ud83c\uddf8",
  "\u2764\ufe0f", " \ud83c\udf89\ud83c\udf89", "a\ud83d\ude00b",
  "e\u0301", "\u00c5", "a\u0300\u0301\u0302", " \u0301", "\u00f1 vs n\u0303", "\u0301\u0301x",
  "\u4e2d\u6587\u5b57\u7b26", "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8", "\ud55c\uad6d\uc5b4",
  " \u6f22\u5b57 \u304b\u306a \u30ab\u30ca",
  "<|endoftext|>", "a<|endoftext|>b", " <|endoftext|>", "<|endoftext|><|endoftext|>",
  "", "Hello, world!", "Mr. O'Neil's caf\u00e9 \u2014 na\u00efve r\u00e9sum\u00e9",
  "def f(x):\n    return x**2\n", "https://example.com/a?b=c&d=e#f", "$$$", "!!!???", "---", "...", '"quoted"',
  "\u0391\u03b8\u03ae\u03bd\u03b1", "\u041c\u043e\u0441\u043a\u0432\u0430", "\u05e9\u05dc\u05d5\u05dd",
  "\u0645\u0631\u062d\u0628\u0627", "\u0928\u092e\u0938\u094d\u0924\u0947", "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35",
  "\ud835\udc00\ud835\udc01", "\ue000", "\uffff", "\udbff\udfff", "\u0000", "\u0001\u0002", "\u007f",
  "tab\tseparated\tvalues", "CRLF\r\nline\r\n", "trailing   ", "   leading", " ", "  ", "\n", "\n\n", " \n", "\n ",
  "a \n b", "a  \n\nb", "end\n\n\n", "x\u00a0\u00a0y", "HTTPServerError", "snake_case_name", "camelCaseName",
  "ALLCAPS", "MiXeD", "\u00ff\u00fe", "1st 2nd 3rd", "v1.2.3-beta", "#hashtag @mention", "email@example.com",
);
for (let n = 1; n <= 20; ++n) strings.push(' '.repeat(n) + 'x', '\n'.repeat(n) + 'x', ' '.repeat(n), '\t'.repeat(n) + 'x');
strings.push(' '.repeat(100), ' '.repeat(100) + 'x', '\n'.repeat(64), 'a'.repeat(300), '!'.repeat(200), '1'.repeat(50));

const golden = strings.map((text) => ({ text, ids: Array.from(enc.encode_ordinary(text)) }));
fs.writeFileSync(process.argv[2], JSON.stringify(golden, null, 0).replace(/\},\{/g, '},\n{') + '\n');
console.log(`wrote ${golden.length} strings`);
enc.free();
