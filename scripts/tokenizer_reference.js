#!/usr/bin/env node
// Reference tokenizers for the agreement tests: independent implementations run by node.
//
//   node scripts/tokenizer_reference.js encode NODE_MODULES KIND ARG OUT.bin IN... | @LIST
//     KIND tiktoken      ARG gpt2|cl100k_base|o200k_base   npm tiktoken (tiktoken's Rust core as WASM)
//     KIND tiktoken-file ARG a rank file ("<base64> <rank>" lines) with Llama 3's pattern and
//                            specials, run by npm tiktoken's Tiktoken class
//     KIND llama3-js     ARG -                              npm llama3-tokenizer-js
//     KIND hf            ARG tokenizer.json                 npm @huggingface/tokenizers (the
//                            tokenizer code of @huggingface/transformers, without onnxruntime),
//                            with tokenizer_config.json beside it when present
//   Every input is read as UTF-8 (ill-formed bytes become U+FFFD as TextDecoder does) and
//   encoded as plain text without added special tokens. OUT.bin: per input, a little-endian
//   uint32 count and that many uint32 ids. Exit status 2 when a package cannot be loaded.
//
//   node scripts/tokenizer_reference.js nfd IN OUT     OUT = IN in Unicode NFD (String.normalize)
//   node scripts/tokenizer_reference.js nfc IN OUT     IN holds records (uint32 length + UTF-8);
//                                                      OUT the records in NFC (String.normalize)
//   node scripts/tokenizer_reference.js utf8 IN OUT    IN holds records (uint32 length + bytes);
//                                                      OUT the same records decoded by TextDecoder
'use strict';
const fs = require('fs');
const path = require('path');

const LLAMA3_PATTERN = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

function llama3Specials(base) {
  const names = ['<|begin_of_text|>', '<|end_of_text|>'];
  for (let i = 0; i < 4; i++) names.push(`<|reserved_special_token_${i}|>`);
  names.push('<|start_header_id|>', '<|end_header_id|>', '<|reserved_special_token_4|>', '<|eot_id|>');
  for (let i = 5; i <= 250; i++) names.push(`<|reserved_special_token_${i}|>`);
  const out = {};
  names.forEach((n, i) => { out[n] = base + i; });
  return out;
}

function load(nodeModules, kind, arg) {
  const req = (p) => require(path.join(path.resolve(nodeModules), p));
  if (kind === 'tiktoken') {
    const enc = req('tiktoken').get_encoding(arg);
    return (text) => enc.encode_ordinary(text);
  }
  if (kind === 'tiktoken-file') {
    const { Tiktoken } = req('tiktoken');
    const ranks = fs.readFileSync(arg, 'utf8');
    const base = ranks.split('\n').filter((l) => l.length > 0).length;
    const enc = new Tiktoken(ranks, llama3Specials(base), LLAMA3_PATTERN);
    return (text) => enc.encode_ordinary(text);
  }
  if (kind === 'llama3-js') {
    const t = req('llama3-tokenizer-js/bundle/commonjs-llama3-tokenizer-with-baked-data.cjs').llama3Tokenizer;
    return (text) => t.encode(text, { bos: false, eos: false });
  }
  if (kind === 'hf') {
    const { Tokenizer } = req('@huggingface/tokenizers');
    const json = JSON.parse(fs.readFileSync(arg, 'utf8'));
    const cfgPath = path.join(path.dirname(arg), 'tokenizer_config.json');
    const config = fs.existsSync(cfgPath) ? JSON.parse(fs.readFileSync(cfgPath, 'utf8')) : {};
    const t = new Tokenizer(json, config);
    return (text) => t.encode(text, { add_special_tokens: false }).ids;
  }
  throw new Error('unknown kind ' + kind);
}

const [mode, ...rest] = process.argv.slice(2);
if (mode === 'nfd') {
  const [inp, out] = rest;
  fs.writeFileSync(out, fs.readFileSync(inp, 'utf8').normalize('NFD'));
  process.exit(0);
}
if (mode === 'utf8' || mode === 'nfc') {
  const [inp, out] = rest;
  const data = fs.readFileSync(inp);
  const dec = new TextDecoder('utf-8');
  const chunks = [];
  for (let off = 0; off < data.length;) {
    const n = data.readUInt32LE(off);
    let text = dec.decode(data.subarray(off + 4, off + 4 + n));
    if (mode === 'nfc') text = text.normalize('NFC');
    const s = Buffer.from(text, 'utf8');
    const len = Buffer.alloc(4);
    len.writeUInt32LE(s.length, 0);
    chunks.push(len, s);
    off += 4 + n;
  }
  fs.writeFileSync(out, Buffer.concat(chunks));
  process.exit(0);
}
if (mode !== 'encode') {
  console.error('usage: tokenizer_reference.js encode NODE_MODULES KIND ARG OUT.bin IN... | nfd|nfc IN OUT | utf8 IN OUT');
  process.exit(1);
}
const [nodeModules, kind, arg, outPath, ...args] = rest;
const inputs = args.flatMap((a) => a.startsWith('@')
  ? fs.readFileSync(a.slice(1), 'utf8').split('\n').filter((l) => l.length > 0) : [a]);
let encode;
try {
  encode = load(nodeModules, kind, arg);
} catch (e) {
  console.error('cannot load the reference tokenizer (' + kind + ' ' + arg + '): ' + e.message);
  process.exit(2);
}
const chunks = [];
for (const file of inputs) {
  const ids = encode(fs.readFileSync(file, 'utf8'));
  const buf = Buffer.alloc(4 * (ids.length + 1));
  buf.writeUInt32LE(ids.length, 0);
  for (let i = 0; i < ids.length; i++) buf.writeUInt32LE(ids[i], 4 * (i + 1));
  chunks.push(buf);
}
fs.writeFileSync(outPath, Buffer.concat(chunks));
