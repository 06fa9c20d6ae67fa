#!/usr/bin/env python3
"""Generates src/tokenizer/unicode_classes.cc: the Unicode categories that the pre-tokenizer
patterns use (\\p{L} split into Lu+Lt / Ll / Lm+Lo, \\p{M}, \\p{N}, and whitespace), in two
versions, each taken from the regex engine that a reference implementation runs:

  node:        node's own regex engine (ICU), /\\p{Lu}/u ... tested on every code point. The
               JavaScript references (@huggingface/tokenizers, llama3-tokenizer-js) run there.
  regex crate: the Rust regex crate's tables as compiled into npm tiktoken's WASM build
               (tiktoken_bg.wasm), the engine tiktoken itself runs. The crate stores each
               class as sorted (first, last) pairs of 32-bit code points; the script finds each
               class by its first ranges as node gives them and keeps the candidate table
               closest to node's. It prints how the two versions differ (new code points of a
               later Unicode version, recategorised ones), so a mismatch is visible.

The tables are node's ranges, then the regex crate's as the ranges where it differs from node's
(the two agree on all but a few thousand code points, so one table serves both).

Whitespace: both JavaScript's \\s and the Unicode White_Space property (\\p{White_Space},
which is \\s for the Rust regex crate) are recorded; they differ only at U+0085 and U+FEFF.

Usage: python3 scripts/gen_unicode_classes.py --wasm .../tiktoken/tiktoken_bg.wasm > OUT.cc
       python3 scripts/gen_unicode_classes.py --wasm ... --dump OUT.bin   (for the tests)
"""
import argparse
import json
import struct
import subprocess
import sys

CLASSES = ["Lu", "Lt", "Ll", "Lm", "Lo", "M", "N"]

NODE_SCRIPT = r"""
const names = ['Lu', 'Lt', 'Ll', 'Lm', 'Lo', 'M', 'N', 'White_Space'];
const out = {};
const ranges = (re) => {
  const r = []; let start = -1;
  for (let cp = 0; cp <= 0x110000; cp++) {
    const inside = cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF) &&
                   re.test(String.fromCodePoint(cp));
    if (inside && start < 0) start = cp;
    else if (!inside && start >= 0) { r.push([start, cp - 1]); start = -1; }
  }
  return r;
};
for (const n of names) out[n] = ranges(new RegExp('\\p{' + n + '}', 'u'));
out.js_space = ranges(/\s/u);
out.version = process.versions.node + ' unicode ' + process.versions.unicode +
              ' icu ' + process.versions.icu;
process.stdout.write(JSON.stringify(out));
"""

# Category numbers: must match enum class UnicodeCategory in unicode_classes.h.
CAT = {"other": 0, "upper": 1, "lower": 2, "other_letter": 3, "mark": 4, "number": 5,
       "space": 6, "white_space_only": 7, "js_space_only": 8}


def expand(ranges):
    s = set()
    for a, b in ranges:
        s.update(range(a, b + 1))
    return s


def wasm_tables(path, node):
    data = open(path, "rb").read()

    def read_table(off):
        out, prev = [], -1
        while off + 8 <= len(data):
            a, b = struct.unpack_from("<2I", data, off)
            if a <= prev or b < a or b > 0x10FFFF:
                break
            out.append((a, b))
            prev, off = b, off + 8
        return out

    tables = {}
    for name in CLASSES:
        want = node[name]
        probe = b"".join(struct.pack("<2I", a, b) for a, b in want[:2])
        best = None
        at = data.find(probe)
        while at >= 0:
            got = expand(read_table(at))
            diff = len(got ^ expand(want))
            if best is None or diff < best[0]:
                best = (diff, got)
            at = data.find(probe, at + 1)
        if best is None:
            sys.exit(f"{path}: no table for \\p{{{name}}} found")
        if best[0] > len(expand(want)) // 5 + 100:
            sys.exit(f"{path}: the closest table for \\p{{{name}}} differs from node's in "
                     f"{best[0]} code points: not the regex crate's table")
        tables[name] = best[1]
    return tables


def categories(sets, white_space, js_space):
    cat = {}
    for name, c in (("Lu", "upper"), ("Lt", "upper"), ("Ll", "lower"), ("Lm", "other_letter"),
                    ("Lo", "other_letter"), ("M", "mark"), ("N", "number")):
        for cp in sets[name]:
            if cp in cat:
                sys.exit(f"U+{cp:04X} in two categories")
            cat[cp] = CAT[c]
    for cp in white_space | js_space:
        if cp in cat:
            sys.exit(f"U+{cp:04X} is whitespace and {cat[cp]}")
        cat[cp] = CAT["space"] if cp in white_space and cp in js_space else (
            CAT["white_space_only"] if cp in white_space else CAT["js_space_only"])
    return cat


def runs(cat, base=None):
    """Maximal runs of one category in `cat`; with `base`, only where `cat` differs from it
    (a code point absent from `cat` there counts as kOther)."""
    out, start, cur = [], None, None
    for cp in range(0x110001):
        c = cat.get(cp) if cp <= 0x10FFFF else None
        if base is not None and cp <= 0x10FFFF:
            c = c or 0
            if c == (base.get(cp) or 0):
                c = None
        if c != cur:
            if cur is not None:
                out.append((start, cp - 1, cur))
            start, cur = cp, c
    return out


def emit_table(name, count_name, rs):
    print(f"const UnicodeRange {name}[] = {{")
    line = " "
    for a, b, c in rs:
        item = f" {{0x{a:X}, 0x{b:X}, {c}}},"
        if len(line) + len(item) > 96:
            print(line)
            line = " "
        line += item
    print(line)
    print("};")
    print(f"const int {count_name} = {len(rs)};")
    print()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--wasm", required=True, help="npm tiktoken's tiktoken_bg.wasm")
    ap.add_argument("--node", default="node")
    ap.add_argument("--dump", help="instead of C++, write one category byte per code point, "
                                   "node's then the regex crate's (for the tests)")
    args = ap.parse_args()

    raw = subprocess.run([args.node, "-e", NODE_SCRIPT], check=True, capture_output=True).stdout
    node = json.loads(raw)
    version = node.pop("version")
    white_space, js_space = expand(node["White_Space"]), expand(node["js_space"])
    node_sets = {n: expand(node[n]) for n in CLASSES}
    crate_sets = wasm_tables(args.wasm, node)

    notes = []
    for n in CLASSES:
        only_node, only_crate = node_sets[n] - crate_sets[n], crate_sets[n] - node_sets[n]
        msg = f"\\p{{{n}}}: {len(only_node)} code points only in node, {len(only_crate)} only in the regex crate"
        if only_crate:
            msg += " (" + " ".join(f"U+{c:04X}" for c in sorted(only_crate)[:8]) + ")"
        print(msg, file=sys.stderr)
        notes.append(msg)

    node_cat = categories(node_sets, white_space, js_space)
    crate_cat = categories(crate_sets, white_space, js_space)
    if args.dump:
        out = bytearray(2 * 0x110000)
        for cp, c in node_cat.items():
            out[cp] = c
        for cp, c in crate_cat.items():
            out[0x110000 + cp] = c
        open(args.dump, "wb").write(out)
        return
    node_runs = runs(node_cat)
    crate_changes = runs(crate_cat, base=node_cat)
    print("// GENERATED FILE: do not edit. Regenerate with")
    print("//   python3 scripts/gen_unicode_classes.py")
    print("//     --wasm $FORGE_DATA_DIR/npm/node_modules/tiktoken/tiktoken_bg.wasm")
    print("//     > src/tokenizer/unicode_classes.cc")
    print(f"// node: node {version}, its regex engine asked about every code point.")
    print("// regex crate: the Rust regex crate's tables inside npm tiktoken's WASM build.")
    for n in notes:
        print("//   " + n)
    print('#include "tokenizer/unicode_classes.h"')
    print()
    print("namespace forge::unicode_tables {")
    print()
    emit_table("kNodeRanges", "kNodeRangeCount", node_runs)
    print("// The regex crate's categories: node's, changed on these ranges (0: in no class).")
    emit_table("kRegexCrateChanges", "kRegexCrateChangeCount", crate_changes)
    print("}  // namespace forge::unicode_tables")


if __name__ == "__main__":
    main()
