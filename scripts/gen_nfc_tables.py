#!/usr/bin/env python3
"""Generates src/tokenizer/nfc_tables.cc: the data Unicode NFC needs, taken from node's own
String.prototype.normalize (ICU), the engine @huggingface/tokenizers normalises with:

  decompositions: the full canonical decomposition (NFD) of every code point that has one,
                  Hangul syllables aside (they decompose by arithmetic);
  combining classes: every code point that is stable under NFD and reorders against U+0301 or
                  U+0345 is a non-starter; sorting them with "a before b when NFD(b a) = a b"
                  gives the canonical combining classes as ranks 1..K (ranks keep the order and
                  the ties, which is all canonical ordering and composition blocking use);
  compositions:   for each code point C that NFC keeps and whose NFD is d0..dk (k >= 1), the
                  pair (NFC(d0..dk-1), dk) -> C, checked by NFC(pair) == C.

Usage: python3 scripts/gen_nfc_tables.py > src/tokenizer/nfc_tables.cc
"""
import json
import subprocess
import sys

NODE = r"""
const S = (cp) => String.fromCodePoint(cp);
const cps = (s) => Array.from(s).map((c) => c.codePointAt(0));
const out = {decomp: [], ccc: [], comp: [], version: process.versions.node + ' unicode ' +
             process.versions.unicode + ' icu ' + process.versions.icu};
const stable = [];
for (let cp = 0; cp <= 0x10FFFF; cp++) {
  if (cp >= 0xD800 && cp <= 0xDFFF) continue;
  const s = S(cp), d = s.normalize('NFD');
  if (d !== s) { if (!(cp >= 0xAC00 && cp <= 0xD7A3)) out.decomp.push([cp, cps(d)]); }
  else stable.push(cp);
}
const reorders = (a, b) => (S(a) + S(b)).normalize('NFD') === S(b) + S(a);
const ns = stable.filter((cp) => reorders(0x301, cp) || reorders(cp, 0x301) || reorders(0x345, cp));
ns.sort((a, b) => reorders(a, b) ? 1 : reorders(b, a) ? -1 : 0);
let rank = 0;
for (let i = 0; i < ns.length; i++) {
  if (i === 0 || reorders(ns[i], ns[i - 1])) rank++;
  out.ccc.push([ns[i], rank]);
}
for (const [cp, d] of out.decomp) {
  if (S(cp).normalize('NFC') !== S(cp) || d.length < 2) continue;
  const a = cps(String.fromCodePoint(...d.slice(0, -1)).normalize('NFC'));
  const b = d[d.length - 1];
  if (a.length !== 1 || (S(a[0]) + S(b)).normalize('NFC') !== S(cp)) {
    throw new Error('no composition pair for U+' + cp.toString(16));
  }
  out.comp.push([a[0], b, cp]);
}
process.stdout.write(JSON.stringify(out));
"""


def emit_rows(items, fmt, per_line):
    line = " "
    for it in items:
        s = " " + fmt(it) + ","
        if len(line) + len(s) > 96:
            print(line)
            line = " "
        line += s
    print(line)


def main():
    data = json.loads(subprocess.run(["node", "-e", NODE], check=True, capture_output=True).stdout)
    decomp, ccc, comp = data["decomp"], data["ccc"], data["comp"]
    print("// GENERATED FILE: do not edit. Regenerate with")
    print("//   python3 scripts/gen_nfc_tables.py > src/tokenizer/nfc_tables.cc")
    print(f"// Source: node {data['version']}, String.prototype.normalize on every code point.")
    print(f"// {len(decomp)} decompositions, {len(ccc)} non-starters in {max(r for _, r in ccc)} "
          f"combining classes (as ranks), {len(comp)} compositions.")
    print('#include "tokenizer/nfc.h"')
    print()
    print("namespace forge::nfc_tables {")
    print()
    flat, rows = [], []
    for cp, d in decomp:
        rows.append((cp, len(flat), len(d)))
        flat.extend(d)
    print("const NfcDecomposition kDecompositions[] = {")
    emit_rows(rows, lambda r: f"{{0x{r[0]:X}, {r[1]}, {r[2]}}}", 6)
    print("};")
    print(f"const int kDecompositionCount = {len(rows)};")
    print("const uint32_t kDecompositionData[] = {")
    emit_rows(flat, lambda c: f"0x{c:X}", 12)
    print("};")
    print()
    print("const NfcClass kCombiningClasses[] = {")
    emit_rows(sorted(ccc), lambda r: f"{{0x{r[0]:X}, {r[1]}}}", 8)
    print("};")
    print(f"const int kCombiningClassCount = {len(ccc)};")
    print()
    print("const NfcComposition kCompositions[] = {")
    emit_rows(comp, lambda r: f"{{0x{r[0]:X}, 0x{r[1]:X}, 0x{r[2]:X}}}", 4)
    print("};")
    print(f"const int kCompositionCount = {len(comp)};")
    print()
    print("}  // namespace forge::nfc_tables")


if __name__ == "__main__":
    main()
