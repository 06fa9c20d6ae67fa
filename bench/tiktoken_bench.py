#!/usr/bin/env python3
"""Python's native tiktoken (Rust) on the same documents as forge-tokenizer-bench, printing
the same JSON lines: tiktoken.get_encoding(name).encode_ordinary_batch(docs, num_threads=T).

  python3 bench/tiktoken_bench.py --tokenizer cl100k_base,o200k_base --input FILE --threads 1,16

Documents: the file's lines grouped in order until each holds at least --doc-bytes bytes,
decoded as UTF-8 with ill-formed bytes replaced (as forge-tokenizer-bench does). The best of
--repeat runs is reported; building the encoding is not timed. A tiktoken-format rank file
can be named as llama3=PATH (Llama 3's pattern and special tokens). Named encodings are
built from npm tiktoken's encoders/<name>.json when --encoders DIR (default
$FORGE_DATA_DIR/npm/node_modules/tiktoken/encoders) has them -- the same ranks Forge reads, and
no download -- else by tiktoken.get_encoding.
"""
import argparse
import base64
import json
import os
import time

import tiktoken
from tiktoken.load import load_tiktoken_bpe

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def documents(raw, doc_bytes):
    docs, cur = [], bytearray()
    for line in _lines(raw):
        cur += line
        if len(cur) >= doc_bytes:
            docs.append(bytes(cur).decode("utf-8", errors="replace"))
            cur = bytearray()
    if cur:
        docs.append(bytes(cur).decode("utf-8", errors="replace"))
    return docs


def _lines(raw):
    pos = 0
    while pos < len(raw):
        eol = raw.find(b"\n", pos)
        eol = len(raw) if eol < 0 else eol + 1
        yield raw[pos:eol]
        pos = eol


def ranks_from_npm_json(path):
    """pat_str, special tokens and ranks of an npm tiktoken encoders/<name>.json, whose
    bpe_ranks lines are "<base64> <rank>" or "! <first rank> <base64> <base64> ..."."""
    d = json.load(open(path))
    ranks = {}
    for line in d["bpe_ranks"].split("\n"):
        f = line.split()
        if not f:
            continue
        if f[0] == "!":
            first = int(f[1])
            for i, tok in enumerate(f[2:]):
                ranks[base64.b64decode(tok)] = first + i
        else:
            ranks[base64.b64decode(f[0])] = int(f[1])
    return d["pat_str"], d["special_tokens"], ranks, d.get("explicit_n_vocab")


def encoding(spec, encoders):
    if spec.startswith("llama3="):
        ranks = load_tiktoken_bpe(spec[len("llama3="):])
        names = ["<|begin_of_text|>", "<|end_of_text|>"] + [
            f"<|reserved_special_token_{i}|>" for i in range(4)] + [
            "<|start_header_id|>", "<|end_header_id|>", "<|reserved_special_token_4|>",
            "<|eot_id|>"] + [f"<|reserved_special_token_{i}|>" for i in range(5, 251)]
        specials = {n: len(ranks) + i for i, n in enumerate(names)}
        return "llama3", tiktoken.Encoding("llama3", pat_str=LLAMA3_PATTERN,
                                           mergeable_ranks=ranks, special_tokens=specials)
    path = os.path.join(encoders, spec + ".json") if encoders else ""
    if path and os.path.exists(path):
        pat, specials, ranks, n_vocab = ranks_from_npm_json(path)
        return spec, tiktoken.Encoding(spec, pat_str=pat, mergeable_ranks=ranks,
                                       special_tokens=specials, explicit_n_vocab=n_vocab)
    return spec, tiktoken.get_encoding(spec)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokenizer", default="cl100k_base")
    ap.add_argument("--input", required=True)
    ap.add_argument("--threads", default=f"1,{os.cpu_count()}")
    ap.add_argument("--doc-bytes", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--encoders", default=os.path.join(
        os.environ.get("FORGE_DATA_DIR", ".forge-data"), "npm/node_modules/tiktoken/encoders"))
    args = ap.parse_args()
    raw = open(args.input, "rb").read()
    docs = documents(raw, args.doc_bytes)
    nbytes = sum(len(d.encode("utf-8")) for d in docs)
    for spec in [s for s in args.tokenizer.split(",") if s]:
        name, enc = encoding(spec, args.encoders)
        for threads in [int(t) for t in args.threads.split(",") if t]:
            best, tokens = float("inf"), 0
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                out = enc.encode_ordinary_batch(docs, num_threads=threads)
                best = min(best, time.perf_counter() - t0)
                tokens = sum(len(x) for x in out)
            print(json.dumps({
                "impl": f"tiktoken {tiktoken.__version__}", "tokenizer": name, "threads": threads,
                "documents": len(docs), "bytes": nbytes, "tokens": tokens, "seconds": best,
                "mb_per_s": nbytes / 1e6 / best, "tokens_per_s": tokens / best,
                "tokens_per_s_per_thread": tokens / best / threads}), flush=True)


if __name__ == "__main__":
    main()
