#!/usr/bin/env python3
"""Checks a `forge export` file against the PyTorch anchor model.

usage: check_export_torch.py SAFETENSORS TOKENS_FILE FORGE_LOSS_JSON
                             [--anchor-dir DIR] [--tolerance 1e-4] [--device cpu]

Loads SAFETENSORS (with the `safetensors` package when it is installed, else with the small
reader below), builds torch_baseline.py's GPT (imported from --anchor-dir) with the dims in
the file's __metadata__, loads the weights under the anchor's parameter names (strict), and
evaluates in float32 the batches of TOKENS_FILE (written by `forge eval --dump-tokens`: int32
header batches, micro_batch, seq_len, then inputs and targets, each [batches, micro_batch,
seq_len]). FORGE_LOSS_JSON is the JSON line `forge eval` printed for the same batches (a file,
or the text itself). Prints both losses as JSON; exits 1 when the mean loss or any batch's loss
differs by more than --tolerance relative, 2 on bad input.
"""
import argparse
import json
import os
import struct
import sys

# GPT-2-style export names (worker/checkpoint/safetensors.h) -> the anchor's parameter names.
_TOP = {"transformer.wte.weight": "emb.weight", "transformer.ln_f.weight": "nf.w"}
_BLOCK = {"ln_1.weight": "n1.w", "attn.c_attn.weight": "qkv.weight",
          "attn.c_proj.weight": "o.weight", "ln_2.weight": "n2.w",
          "mlp.c_fc.weight": "gu.weight", "mlp.c_proj.weight": "down.weight"}


def anchor_name(name):
    if name in _TOP:
        return _TOP[name]
    parts = name.split(".", 3)  # transformer, h, i, rest
    if len(parts) == 4 and parts[:2] == ["transformer", "h"] and parts[3] in _BLOCK:
        return "blocks.%s.%s" % (parts[2], _BLOCK[parts[3]])
    raise ValueError("no anchor parameter for tensor %r" % name)


def read_safetensors_raw(path):
    """{name: (dtype, shape, bytes)}, metadata -- the format without any library."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {}) or {}
    base = 8 + n
    out = {}
    for name, info in header.items():
        a, b = info["data_offsets"]
        if not 0 <= a <= b <= len(data) - base:
            raise ValueError("%s: tensor %s has data_offsets %s past the end" % (path, name, (a, b)))
        out[name] = (info["dtype"], list(info["shape"]), data[base + a:base + b])
    return out, meta


def read_token_dump(path):
    """(batches, micro_batch, seq_len, inputs, targets), inputs/targets flat int lists."""
    with open(path, "rb") as f:
        data = f.read()
    nb, b, t = struct.unpack("<3i", data[:12])
    count = nb * b * t
    if len(data) != 12 + 8 * count:
        raise ValueError("%s: %d bytes, expected %d for %d x %d x %d tokens twice"
                         % (path, len(data), 12 + 8 * count, nb, b, t))
    inputs = struct.unpack("<%di" % count, data[12:12 + 4 * count])
    targets = struct.unpack("<%di" % count, data[12 + 4 * count:])
    return nb, b, t, inputs, targets


def load_tensors(path):
    import torch
    try:
        from safetensors import safe_open
    except ImportError:
        safe_open = None
    if safe_open is not None:
        with safe_open(path, framework="pt") as f:
            return {k: f.get_tensor(k).float() for k in f.keys()}, (f.metadata() or {})
    raw, meta = read_safetensors_raw(path)
    dtypes = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
    tensors = {}
    for name, (dtype, shape, data) in raw.items():
        flat = torch.frombuffer(bytearray(data), dtype=dtypes[dtype]) if data else \
            torch.empty(0, dtype=dtypes[dtype])
        tensors[name] = flat.reshape(shape).float()
    return tensors, meta


def anchor_config(meta):
    """The anchor's cfg dict, after checking the model is one the anchor can express."""
    need = ["n_layer", "d_model", "n_head", "n_kv_head", "ffn", "padded_vocab", "seq_len"]
    missing = [k for k in need if k not in meta]
    if missing:
        raise ValueError("__metadata__ lacks %s" % ", ".join(missing))
    # torch_baseline.py hard-codes plain multi-head attention, no QK norm, RMSNorm eps 1e-5
    # and RoPE theta 10000.
    if meta["n_kv_head"] != meta["n_head"]:
        raise ValueError("the anchor has no GQA (n_kv_head %s != n_head %s)"
                         % (meta["n_kv_head"], meta["n_head"]))
    if meta.get("qk_norm", "false") != "false":
        raise ValueError("the anchor has no QK norm")
    if abs(float(meta.get("norm_eps", "1e-5")) - 1e-5) > 1e-12:
        raise ValueError("the anchor's RMSNorm eps is 1e-5, the model's %s" % meta["norm_eps"])
    if float(meta.get("rope_theta", "10000")) != 10000.0:
        raise ValueError("the anchor's RoPE theta is 10000, the model's %s" % meta["rope_theta"])
    return dict(L=int(meta["n_layer"]), d=int(meta["d_model"]), H=int(meta["n_head"]),
                ff=int(meta["ffn"]), V=int(meta["padded_vocab"]), T=int(meta["seq_len"]))


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("safetensors")
    p.add_argument("tokens")
    p.add_argument("forge_loss_json")
    p.add_argument("--anchor-dir", default=os.path.join(os.path.dirname(__file__), "..", "..",
                                                        "shared", "anchors"))
    p.add_argument("--tolerance", type=float, default=1e-4)
    p.add_argument("--device", default="cpu")
    a = p.parse_args(argv)

    import torch
    sys.path.insert(0, os.path.abspath(a.anchor_dir))
    import torch_baseline  # noqa: E402  (the anchor: GPT, RMSNorm, RoPE, SwiGLU)

    text = a.forge_loss_json
    if not text.lstrip().startswith("{"):
        with open(text) as f:
            text = f.read()
    forge = json.loads(text.strip().splitlines()[-1])
    try:
        tensors, meta = load_tensors(a.safetensors)
        cfg = anchor_config(meta)
        nb, b, t, inputs, targets = read_token_dump(a.tokens)
        state = {anchor_name(k): v for k, v in tensors.items()}
    except (ValueError, KeyError, struct.error) as e:
        print("check_export_torch: %s" % e, file=sys.stderr)
        return 2
    if t > cfg["T"]:
        print("check_export_torch: batches of %d tokens, model seq_len %d" % (t, cfg["T"]),
              file=sys.stderr)
        return 2
    if len(forge.get("per_batch", [])) != nb:
        print("check_export_torch: %d batches in %s, %d losses from forge"
              % (nb, a.tokens, len(forge.get("per_batch", []))), file=sys.stderr)
        return 2

    torch.backends.cuda.matmul.allow_tf32 = False  # float32 means float32
    torch.backends.cudnn.allow_tf32 = False
    model = torch_baseline.GPT(cfg).float()
    model.load_state_dict(state, strict=True)
    model.to(a.device).eval()
    x = torch.tensor(inputs, dtype=torch.long).view(nb, b, t).to(a.device)
    y = torch.tensor(targets, dtype=torch.long).view(nb, b, t).to(a.device)
    per_batch = []
    with torch.no_grad():
        for i in range(nb):
            per_batch.append(float(model(x[i], y[i])))
    torch_loss = sum(per_batch) / nb  # summed in batch order, as forge eval does
    forge_loss = float(forge["loss"])

    def rel(u, v):
        return abs(u - v) / max(abs(v), 1e-30)

    batch_rel = [rel(u, float(v)) for u, v in zip(per_batch, forge["per_batch"])]
    result = dict(forge_loss=forge_loss, torch_loss=torch_loss,
                  rel_diff=rel(torch_loss, forge_loss), per_batch_max_rel_diff=max(batch_rel),
                  forge_per_batch=[float(v) for v in forge["per_batch"]],
                  torch_per_batch=per_batch, batches=nb, micro_batch=b, seq_len=t,
                  tolerance=a.tolerance, torch=torch.__version__, device=a.device,
                  model=dict(cfg), tensors=len(state))
    result["ok"] = result["rel_diff"] <= a.tolerance and max(batch_rel) <= a.tolerance
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
