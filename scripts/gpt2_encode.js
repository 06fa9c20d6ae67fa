#!/usr/bin/env node
// Reference GPT-2 (r50k_base) encoder for tests: encodes each input file with npm
// gpt-tokenizer, treating all text as plain text (a literal "<|endoftext|>" is not special).
//
// Usage: node scripts/gpt2_encode.js NODE_MODULES_DIR OUT.bin IN1 [IN2 ...]
// OUT.bin: for each input file, a little-endian uint32 token count followed by that many
// little-endian uint32 ids. Exit status 2 when gpt-tokenizer cannot be loaded.
'use strict';
const fs = require('fs');
const path = require('path');

const [nodeModules, outPath, ...inputs] = process.argv.slice(2);
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
