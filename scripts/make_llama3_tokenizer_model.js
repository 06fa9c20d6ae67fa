#!/usr/bin/env node
// Writes Llama 3's tokenizer in the tiktoken format Meta ships it in (tokenizer.model: one
// "<base64 bytes> <rank>" line per ordinary token, rank = id, 128,000 lines) from the
// vocabulary npm llama3-tokenizer-js bundles (token strings in GPT-2's byte-to-unicode
// alphabet, by id). Special tokens are not in the file; readers add Llama 3's 256.
//
// Usage: node scripts/make_llama3_tokenizer_model.js NODE_MODULES_DIR OUT_FILE
'use strict';
const fs = require('fs');
const path = require('path');

const [nodeModules, out] = process.argv.slice(2);
if (!nodeModules || !out) {
  console.error('usage: make_llama3_tokenizer_model.js NODE_MODULES_DIR OUT_FILE');
  process.exit(1);
}
let tokenizer;
try {
  tokenizer = require(path.join(path.resolve(nodeModules),
      'llama3-tokenizer-js/bundle/commonjs-llama3-tokenizer-with-baked-data.cjs')).llama3Tokenizer;
} catch (e) {
  console.error('cannot load llama3-tokenizer-js from ' + nodeModules + ': ' + e.message);
  process.exit(2);
}

// GPT-2's byte <-> character map: printable Latin-1 bytes stand for themselves, the other 68
// bytes for U+0100.. in byte order.
const charToByte = new Map();
let next = 0x100;
for (let b = 0; b < 256; b++) {
  const printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
  charToByte.set(printable ? b : next++, b);
}

const kOrdinary = 128000;
const vocab = tokenizer.vocabById;
if (!vocab || vocab.length < kOrdinary) {
  console.error('llama3-tokenizer-js: expected at least ' + kOrdinary + ' tokens, found ' +
                (vocab ? vocab.length : 0));
  process.exit(3);
}
const lines = [];
for (let id = 0; id < kOrdinary; id++) {
  const bytes = [];
  for (const ch of vocab[id]) {
    const b = charToByte.get(ch.codePointAt(0));
    if (b === undefined) {
      console.error('token ' + id + ' (' + JSON.stringify(vocab[id]) + ') is not byte-level');
      process.exit(3);
    }
    bytes.push(b);
  }
  lines.push(Buffer.from(bytes).toString('base64') + ' ' + id);
}
fs.mkdirSync(path.dirname(path.resolve(out)), { recursive: true });
const tmp = out + '.tmp';
fs.writeFileSync(tmp, lines.join('\n') + '\n');
fs.renameSync(tmp, out);
