#!/usr/bin/env python3
"""Generates src/tokenizer/unicode_classes.cc: the code point ranges of the three classes
the GPT-2 pre-tokenisation regex uses (\\p{L}, \\p{N}, \\s).

Two sources:
  python: Python's unicodedata (General Category L* / N*; \\s as defined by ECMAScript).
  node:   node's own regex engine, /\\p{L}/u, /\\p{N}/u and /\\s/u tested on every code point.
The reference encoder we check against (npm gpt-tokenizer) runs in node, so `--source node`
(the default) makes our classes identical to its, code point for code point. The script
always prints, on stderr, how the two sources differ, so a version skew is visible.

Usage: python3 scripts/gen_unicode_classes.py [--source node|python] [--node NODE] > OUT.cc
"""
import argparse
import json
import subprocess
import sys
import unicodedata

MAX_CP = 0x10FFFF

# ECMAScript \s: WhiteSpace (TAB VT FF SP NBSP ZWNBSP + category Zs) and LineTerminator.
JS_EXTRA_SPACE = {0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0xFEFF, 0x2028, 0x2029}


def ranges_of(pred):
    out, start = [], None
    for cp in range(MAX_CP + 2):
        inside = cp <= MAX_CP and pred(cp)
        if inside and start is None:
            start = cp
        elif not inside and start is not None:
            out.append((start, cp - 1))
            start = None
    return out


def python_classes():
    def cat(cp):
        return unicodedata.category(chr(cp))
    return {
        "letter": ranges_of(lambda cp: cat(cp).startswith("L")),
        "number": ranges_of(lambda cp: cat(cp).startswith("N")),
        "space": ranges_of(lambda cp: cp in JS_EXTRA_SPACE or cat(cp) == "Zs"),
    }


NODE_SCRIPT = r"""
const classes = {letter: /\p{L}/u, number: /\p{N}/u, space: /\s/u};
const out = {};
for (const [name, re] of Object.entries(classes)) {
  const r = []; let start = -1;
  for (let cp = 0; cp <= 0x110000; cp++) {
    const inside = cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF) &&
                   re.test(String.fromCodePoint(cp));
    if (inside && start < 0) start = cp;
    else if (!inside && start >= 0) { r.push([start, cp - 1]); start = -1; }
  }
  out[name] = r;
}
out.version = process.versions.node + " unicode " + process.versions.unicode +
              " icu " + process.versions.icu;
process.stdout.write(JSON.stringify(out));
"""


def node_classes(node):
    raw = subprocess.run([node, "-e", NODE_SCRIPT], check=True, capture_output=True).stdout
    data = json.loads(raw)
    version = data.pop("version")
    return {k: [tuple(r) for r in v] for k, v in data.items()}, version


def expand(ranges):
    s = set()
    for a, b in ranges:
        s.update(range(a, b + 1))
    return s


def emit(classes, provenance):
    print("// GENERATED FILE: do not edit. Regenerate with")
    print("//   python3 scripts/gen_unicode_classes.py --source node > "
          "src/tokenizer/unicode_classes.cc")
    for line in provenance:
        print("// " + line)
    print('#include "tokenizer/unicode_classes.h"')
    print()
    print("namespace forge::unicode_tables {")
    print()
    for name in ("letter", "number", "space"):
        rs = classes[name]
        print(f"// {name}: {len(rs)} ranges, {sum(b - a + 1 for a, b in rs)} code points")
        print(f"const CodePointRange k{name.capitalize()}Ranges[] = {{")
        line = " "
        for a, b in rs:
            item = f" {{0x{a:X}, 0x{b:X}}},"
            if len(line) + len(item) > 96:
                print(line)
                line = " "
            line += item
        print(line)
        print("};")
        print(f"const int k{name.capitalize()}RangeCount = {len(rs)};")
        print()
    print("}  // namespace forge::unicode_tables")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", choices=["node", "python"], default="node")
    ap.add_argument("--node", default="node")
    args = ap.parse_args()

    py = python_classes()
    py_version = f"Python {sys.version.split()[0]} unicodedata {unicodedata.unidata_version}"
    provenance = []
    try:
        nd, node_version = node_classes(args.node)
    except (OSError, subprocess.CalledProcessError) as e:
        if args.source == "node":
            sys.exit(f"node is needed for --source node: {e}")
        nd, node_version = None, None

    if nd is not None:
        for name in ("letter", "number", "space"):
            a, b = expand(py[name]), expand(nd[name])
            only_node, only_py = sorted(b - a), sorted(a - b)
            msg = (f"{name}: {len(only_node)} code points only in node, "
                   f"{len(only_py)} only in Python")
            print(msg, file=sys.stderr)
            if only_py:
                print(f"  only in Python: {[hex(c) for c in only_py[:20]]}", file=sys.stderr)
            provenance.append("  vs " + py_version + ": " + msg)

    if args.source == "node":
        classes = nd
        provenance.insert(0, f"Source: node {node_version} (/\\p{{L}}/u, /\\p{{N}}/u, /\\s/u),")
        provenance.insert(1, "the engine the reference encoder (npm gpt-tokenizer) runs in.")
    else:
        classes = py
        provenance.insert(0, f"Source: {py_version} (categories L*, N*; ECMAScript \\s).")
    emit(classes, provenance)


if __name__ == "__main__":
    main()
