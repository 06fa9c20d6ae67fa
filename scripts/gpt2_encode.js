#!/usr/bin/env node
// Reference GPT-2 (r50k_base) encoder for tests: encodes each input file with npm
// gpt-tokenizer, treating all text as plain text (a literal "<|endoftext|>" is not special).
//
// Usage: node scripts/gpt2_encode.js NODE_MODULES_DIR OUT.bin IN1 [IN2 ...]
// An argument @LIST names a file listing input paths, one per line (for long lists).
//
//        node scripts/gpt2_encode.js --classes OUT.bin
// writes one byte per code point U+0000..U+10FFFF: the class node's regex engine gives it in
// GPT-2's pattern (0 other, 1 \p{L}, 2 \p{N}, 3 \s; surrogates 0), to check our tables.
// OUT.bin: for each input file, a little-endian uint32 token count followed by that many
// little-endian uint32 ids. Exit status 2 when gpt-tokenizer cannot be loaded.
'use strict';
const fs = require('fs');
const path = require('path');

if (process.argv[2] === '--classes') {
  const out = Buffer.alloc(0x110000);
  for (let cp = 0; cp <= 0x10FFFF; cp++) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    const c = String.fromCodePoint(cp);
    out[cp] = /\p{L}/u.test(c) ? 1 : /\p{N}/u.test(c) ? 2 : /\s/u.test(c) ? 3 : 0;
  }
  fs.writeFileSync(process.argv[3], out);
  process.exit(0);
}

const [nodeModules, outPath, ...args] = process.argv.slice(2);
const inputs = args.flatMap((a) => a.startsWith('@')
  ? fs.readFileSync(a.slice(1), 'utf8').split('\n').filter((l) => l.length > 0) : [a]);
if (!nodeModules || !outPath || inputs.length === 0) {
  console.error('usage: gpt2_encode.js NODE_MODULES_DIR OUT.bin IN1 [IN2 ...]');
  process.exit(1);
}
let encoder;
try {
  encoder = require(path.join(path.resolve(nodeModules), 'gpt-tokenizer/cjs/encoding/r50k_base.js'));
} catch (e) {
  console.error('cannot load gpt-tokenizer from ' + nodeModules + ': ' + e.message);
  process.exit(2);
}
const chunks = [];
for (const file of inputs) {
  const text = fs.readFileSync(file, 'utf8');
  const ids = encoder.encode(text, { disallowedSpecial: new Set() });
  const buf = Buffer.alloc(4 * (ids.length + 1));
  buf.writeUInt32LE(ids.length, 0);
  for (let i = 0; i < ids.length; i++) buf.writeUInt32LE(ids[i], 4 * (i + 1));
  chunks.push(buf);
}
fs.writeFileSync(outPath, Buffer.concat(chunks));
