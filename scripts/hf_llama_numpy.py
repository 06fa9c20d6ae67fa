#!/usr/bin/env python3
"""A Llama forward pass in NumPy, written from transformers' conventions, to check exports.

usage:
  hf_llama_numpy.py compare HF_DIR DUMP [--tol-rel R] [--greedy-steps N] [--no-greedy]
  hf_llama_numpy.py logits HF_DIR IDS...          (prints the last position's top-5 as JSON)

HF_DIR is a Hugging Face Llama directory (config.json + model.safetensors or an index with
shards), as `forge export --format hf` writes it. DUMP is what `forge generate --dump` writes
(safetensors: per prompt i, prompt.<i> I32 ids, logits.<i> F32 [n, vocab], generated.<i> I32).
`compare` computes the logits of every prompt here and compares them with Forge's; when the dump
was greedy (temperature 0) it also decodes greedily here, recomputing the whole forward for each
new token (no cache), and compares the tokens. Prints one JSON object; exits 1 when the logits
differ by more than --tol-rel x max|logit| or the greedy tokens differ, 2 on bad input.

The model, as transformers' LlamaForCausalLM computes it in float32:
- RMSNorm: x * rsqrt(mean(x^2) + eps) in float32, times the weight.
- RoPE: inv_freq[i] = 1 / theta^(2i / head_dim) (float32), rope_scaling "llama3" applied to it
  as Llama 3.1 does; cos/sin of position * inv_freq, duplicated over both halves of the head;
  q * cos + rotate_half(q) * sin with rotate_half(x) = [-x2, x1].
- Attention: GQA by repeating each key/value head num_attention_heads / num_key_value_heads
  times (repeat_kv), scores * head_dim^-0.5, causal mask, softmax in float32.
- MLP: down(silu(gate(x)) * up(x)); no biases.
- LM head: the embedding when tie_word_embeddings, else lm_head.weight.
Safetensors are parsed here by hand (F32, BF16, F16), so nothing but NumPy is needed.
"""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np


def read_safetensors(path):
    """({name: np.ndarray float32 or int32}, metadata) of one file."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {}) or {}
    base = 8 + n
    out = {}
    for name, info in header.items():
        a, b = info["data_offsets"]
        raw = data[base + a:base + b]
        shape = tuple(info["shape"])
        dt = info["dtype"]
        if dt == "F32":
            arr = np.frombuffer(raw, dtype="<f4")
        elif dt == "BF16":
            arr = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        elif dt == "F16":
            arr = np.frombuffer(raw, dtype="<f2").astype(np.float32)
        elif dt == "I32":
            arr = np.frombuffer(raw, dtype="<i4")
        else:
            raise ValueError("%s: tensor %s has dtype %s" % (path, name, dt))
        out[name] = arr.reshape(shape)
    return out, meta


def read_model_dir(d):
    index = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    weights = {}
    for name in files:
        w, _ = read_safetensors(os.path.join(d, name))
        weights.update(w)
    with open(os.path.join(d, "config.json")) as f:
        config = json.load(f)
    return config, weights


def rope_inv_freq(config, head_dim):
    params = config.get("rope_parameters") or {}
    theta = params.get("rope_theta", config.get("rope_theta", 10000.0))
    scaling = params if params else (config.get("rope_scaling") or {})
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    inv = (1.0 / (np.float32(theta) ** (np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32)
                                        / np.float32(head_dim)))).astype(np.float32)
    if kind == "default":
        return inv
    if kind != "llama3":
        raise ValueError("rope type %r is not implemented here" % kind)
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_len = scaling["original_max_position_embeddings"]
    low_wavelen = old_len / low
    high_wavelen = old_len / high
    wavelen = 2 * math.pi / inv
    scaled = np.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)


class Llama:
    def __init__(self, config, weights):
        self.c = config
        self.w = weights
        self.d = config["hidden_size"]
        self.n_head = config["num_attention_heads"]
        self.n_kv = config.get("num_key_value_heads") or self.n_head
        self.hd = config.get("head_dim") or self.d // self.n_head
        self.eps = np.float32(config.get("rms_norm_eps", 1e-6))
        self.layers = config["num_hidden_layers"]
        self.inv_freq = rope_inv_freq(config, self.hd)
        emb = weights["model.embed_tokens.weight"]
        self.lm_head = emb if config.get("tie_word_embeddings", False) else weights["lm_head.weight"]

    def norm(self, x, w):
        var = np.mean(x * x, axis=-1, keepdims=True, dtype=np.float32)
        return (x * (1.0 / np.sqrt(var + self.eps))).astype(np.float32) * w

    def rope(self, x, cos, sin):  # x [heads, T, hd]
        half = self.hd // 2
        rot = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
        return (x * cos + rot * sin).astype(np.float32)

    def forward(self, ids):
        ids = np.asarray(ids, dtype=np.int64)
        T = len(ids)
        x = self.w["model.embed_tokens.weight"][ids].astype(np.float32)
        freqs = np.outer(np.arange(T, dtype=np.float32), self.inv_freq).astype(np.float32)
        emb = np.concatenate([freqs, freqs], axis=-1)
        cos, sin = np.cos(emb).astype(np.float32), np.sin(emb).astype(np.float32)
        mask = np.triu(np.full((T, T), -np.inf, dtype=np.float32), k=1)
        group = self.n_head // self.n_kv
        for l in range(self.layers):
            p = "model.layers.%d." % l
            h = self.norm(x, self.w[p + "input_layernorm.weight"])
            q = (h @ self.w[p + "self_attn.q_proj.weight"].T).reshape(T, self.n_head, self.hd)
            k = (h @ self.w[p + "self_attn.k_proj.weight"].T).reshape(T, self.n_kv, self.hd)
            v = (h @ self.w[p + "self_attn.v_proj.weight"].T).reshape(T, self.n_kv, self.hd)
            q = self.rope(q.transpose(1, 0, 2), cos, sin)
            k = self.rope(k.transpose(1, 0, 2), cos, sin)
            v = v.transpose(1, 0, 2)
            k = np.repeat(k, group, axis=0)  # repeat_kv: head h reads kv head h // group
            v = np.repeat(v, group, axis=0)
            s = (q @ k.transpose(0, 2, 1)) * np.float32(self.hd ** -0.5) + mask
            s = s - s.max(axis=-1, keepdims=True)
            e = np.exp(s)
            a = (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)
            o = (a @ v).transpose(1, 0, 2).reshape(T, self.n_head * self.hd)
            x = x + o @ self.w[p + "self_attn.o_proj.weight"].T
            h = self.norm(x, self.w[p + "post_attention_layernorm.weight"])
            g = h @ self.w[p + "mlp.gate_proj.weight"].T
            u = h @ self.w[p + "mlp.up_proj.weight"].T
            x = x + ((g / (1.0 + np.exp(-g))) * u).astype(np.float32) @ self.w[p + "mlp.down_proj.weight"].T
        x = self.norm(x, self.w["model.norm.weight"])
        return (x @ self.lm_head.T).astype(np.float32)


def compare(args):
    config, weights = read_model_dir(args.hf_dir)
    model = Llama(config, weights)
    dump, meta = read_safetensors(args.dump)
    n = int(meta.get("prompts", "0"))
    greedy = float(meta.get("temperature", "0")) == 0.0 and not args.no_greedy
    eos = config.get("eos_token_id")
    eos = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
    worst_abs, worst_rel, scale = 0.0, 0.0, 0.0
    greedy_equal = True
    per = []
    for i in range(n):
        ids = dump["prompt.%d" % i].tolist()
        want = dump["logits.%d" % i]
        got = model.forward(ids)
        if got.shape != want.shape:
            raise ValueError("prompt %d: logits %s here, %s in the dump" % (i, got.shape, want.shape))
        err = float(np.max(np.abs(got - want)))
        mag = float(np.max(np.abs(got)))
        worst_abs = max(worst_abs, err)
        scale = max(scale, mag)
        worst_rel = max(worst_rel, err / mag if mag > 0 else err)
        item = {"prompt": i, "tokens": len(ids), "max_abs": err, "max_rel": err / mag if mag else err}
        if greedy:
            forge_gen = dump["generated.%d" % i].tolist()
            steps = len(forge_gen) if args.greedy_steps is None else min(args.greedy_steps, len(forge_gen))
            seq, mine = list(ids), []
            for _ in range(steps):
                nxt = int(np.argmax(model.forward(seq)[-1]))
                mine.append(nxt)
                seq.append(nxt)
                if nxt in eos:
                    break
            item["greedy_equal"] = mine == forge_gen[:len(mine)]
            item["greedy_tokens"] = len(mine)
            greedy_equal = greedy_equal and item["greedy_equal"]
        per.append(item)
    ok = worst_rel <= args.tol_rel and greedy_equal
    print(json.dumps({"hf_dir": args.hf_dir, "dtype": config.get("dtype", config.get("torch_dtype")),
                      "head_dim": model.hd, "heads": model.n_head, "kv_heads": model.n_kv,
                      "prompts": n, "max_abs": worst_abs, "max_rel": worst_rel,
                      "max_logit": scale, "greedy_checked": greedy, "greedy_equal": greedy_equal,
                      "tol_rel": args.tol_rel, "ok": ok, "per_prompt": per}))
    return 0 if ok else 1


def logits(args):
    config, weights = read_model_dir(args.hf_dir)
    out = Llama(config, weights).forward([int(t) for t in args.ids])[-1]
    top = np.argsort(-out)[:5]
    print(json.dumps({"top": [[int(t), float(out[t])] for t in top]}))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compare")
    c.add_argument("hf_dir")
    c.add_argument("dump")
    c.add_argument("--tol-rel", type=float, default=1e-4)
    c.add_argument("--greedy-steps", type=int, default=None)
    c.add_argument("--no-greedy", action="store_true",
                   help="compare logits only (e.g. Forge on float32 weights, the file in bf16)")
    g = sub.add_parser("logits")
    g.add_argument("hf_dir")
    g.add_argument("ids", nargs="+")
    args = ap.parse_args()
    try:
        return compare(args) if args.cmd == "compare" else logits(args)
    except (OSError, ValueError, KeyError) as e:
        print("hf_llama_numpy: %s" % e, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
