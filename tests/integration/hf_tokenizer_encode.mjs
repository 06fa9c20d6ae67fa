// Encodes a text file with a Hugging Face tokenizer.json through @huggingface/tokenizers (the
// tokenizers library's JavaScript port): the independent implementation Forge's exported
// tokenizer files are checked against.
//   node hf_tokenizer_encode.mjs NODE_MODULES TOKENIZER_DIR TEXT_FILE  ->  {"ids": [...], "decoded_equal": true}
import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";

const [modules, dir, textFile] = process.argv.slice(2);
const lib = path.join(modules, "@huggingface/tokenizers/dist/tokenizers.mjs");
const { Tokenizer } = await import(pathToFileURL(lib).href);
const json = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8"));
const config = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8"));
const tok = new Tokenizer(json, config);
const text = fs.readFileSync(textFile, "utf8");
const ids = tok.encode(text, { add_special_tokens: false }).ids;
const decoded = tok.decode(ids);
process.stdout.write(JSON.stringify({ ids, decoded_equal: decoded === text }));
