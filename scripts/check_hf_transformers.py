#!/usr/bin/env python3
"""Checks a `forge export --format hf` directory with transformers itself.

usage: check_hf_transformers.py HF_DIR DUMP [--device cuda|cpu] [--tol-rel 1e-4]
                                [--attn sdpa|eager] [--no-numpy]

HF_DIR: the exported directory. DUMP: what `forge generate --checkpoint ... --dump DUMP` wrote
for the same model with greedy decoding (the default): per prompt i, prompt.<i> (ids),
logits.<i> (Forge's logits at every prompt position) and generated.<i> (Forge's greedy tokens),
and the prompt texts in its metadata.

1. AutoModelForCausalLM.from_pretrained(HF_DIR) in float32 (no custom code) must be a
   LlamaForCausalLM; AutoTokenizer.from_pretrained(HF_DIR) must encode each prompt text to
   Forge's prompt ids (after Forge's leading begin/end-of-text token).
2. Its logits at every prompt position against Forge's: max |diff| / max |logit| <= --tol-rel
   (TF32 off, so the GPU computes in float32).
3. model.generate(greedy, as many new tokens as Forge made) must give Forge's tokens.
4. Unless --no-numpy: scripts/hf_llama_numpy.py (the NumPy Llama the CPU tests use) against
   transformers on the same directory and on small random LlamaForCausalLM models that
   transformers builds itself with the architecture knobs (head_dim independent of
   hidden_size / heads, an untied lm_head, Llama 3.1 rope_scaling), so the reference is checked
   against transformers for those apart from Forge's own exports.
Prints one JSON object; exits 1 when a check fails.
"""
import argparse
import json
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_llama_numpy  # noqa: E402


def rel_err(a, b):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    scale = float(np.max(np.abs(b))) or 1.0
    return float(np.max(np.abs(a - b))), float(np.max(np.abs(a - b))) / scale


def check_export(args, torch, transformers):
    model = transformers.AutoModelForCausalLM.from_pretrained(
        args.hf_dir, dtype=torch.float32, attn_implementation=args.attn).to(args.device).eval()
    out = {"class": type(model).__name__}
    tok = transformers.AutoTokenizer.from_pretrained(args.hf_dir)
    dump, meta = hf_llama_numpy.read_safetensors(args.dump)
    n = int(meta.get("prompts", "0"))
    eos = model.generation_config.eos_token_id
    worst_abs = worst_rel = 0.0
    greedy_equal = tokenizer_equal = True
    prompts = []
    for i in range(n):
        ids = dump["prompt.%d" % i].tolist()
        text = meta.get("prompt_text.%d" % i)
        item = {"prompt": i, "tokens": len(ids)}
        if text is not None:
            enc = tok(text, add_special_tokens=False)["input_ids"]
            item["tokenizer_equal"] = enc == ids[1:]
            tokenizer_equal = tokenizer_equal and item["tokenizer_equal"]
        x = torch.tensor([ids], device=args.device)
        with torch.no_grad():
            logits = model(x).logits[0].float().cpu().numpy()
        a, r = rel_err(logits, dump["logits.%d" % i])
        item.update({"max_abs": a, "max_rel": r})
        worst_abs, worst_rel = max(worst_abs, a), max(worst_rel, r)
        forge_gen = dump["generated.%d" % i].tolist()
        if forge_gen:
            with torch.no_grad():
                g = model.generate(x, max_new_tokens=len(forge_gen), do_sample=False,
                                   eos_token_id=eos, pad_token_id=eos if isinstance(eos, int) else None)
            mine = g[0, len(ids):].tolist()
            item["greedy_equal"] = mine == forge_gen
            if not item["greedy_equal"]:
                item["transformers_tokens"], item["forge_tokens"] = mine, forge_gen
            greedy_equal = greedy_equal and item["greedy_equal"]
        prompts.append(item)
    out.update({"prompts": prompts, "max_abs": worst_abs, "max_rel": worst_rel,
                "greedy_equal": greedy_equal, "tokenizer_equal": tokenizer_equal,
                "ok": out["class"] == "LlamaForCausalLM" and worst_rel <= args.tol_rel
                and greedy_equal and tokenizer_equal})
    return out, model


def numpy_vs_transformers(model_dir, torch, transformers, device, seq):
    config, weights = hf_llama_numpy.read_model_dir(model_dir)
    mine = hf_llama_numpy.Llama(config, weights).forward(seq)
    m = transformers.AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="eager").to(device).eval()
    with torch.no_grad():
        theirs = m(torch.tensor([seq], device=device)).logits[0].float().cpu().numpy()
    a, r = rel_err(mine, theirs)
    return {"max_abs": a, "max_rel": r}


def numpy_checks(args, torch, transformers):
    rng = np.random.default_rng(0)
    out = {}
    config, _ = hf_llama_numpy.read_model_dir(args.hf_dir)
    seq = rng.integers(0, config["vocab_size"], size=24).tolist()
    out["export"] = numpy_vs_transformers(args.hf_dir, torch, transformers, args.device, seq)
    variants = {
        "head_dim_untied_llama3": dict(head_dim=32, tie_word_embeddings=False,
                                       rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                                     "low_freq_factor": 1.0,
                                                     "high_freq_factor": 4.0,
                                                     "original_max_position_embeddings": 16}),
        "gqa_tied_theta500k": dict(head_dim=16, tie_word_embeddings=True, rope_theta=500000.0),
    }
    for name, extra in variants.items():
        cfg = transformers.LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=160,
                                       num_hidden_layers=2, num_attention_heads=4,
                                       num_key_value_heads=2, max_position_embeddings=64,
                                       rms_norm_eps=1e-5, **extra)
        torch.manual_seed(0)
        m = transformers.LlamaForCausalLM(cfg)
        with torch.no_grad():  # norm gains away from 1, so a misplaced norm shows
            for p_name, p in m.named_parameters():
                if p_name.endswith("norm.weight"):
                    p.uniform_(0.5, 1.5)
        with tempfile.TemporaryDirectory() as d:
            m.save_pretrained(d)
            out[name] = numpy_vs_transformers(d, torch, transformers, args.device,
                                              rng.integers(0, 1000, size=40).tolist())
    ok = all(v["max_rel"] <= 1e-4 for v in out.values())
    return out, ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("hf_dir")
    ap.add_argument("dump")
    ap.add_argument("--device", default=None)
    ap.add_argument("--tol-rel", type=float, default=1e-4)
    ap.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"])
    ap.add_argument("--no-numpy", action="store_true")
    args = ap.parse_args()
    import torch
    import transformers
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    result = {"transformers": transformers.__version__, "torch": torch.__version__,
              "device": args.device, "hf_dir": args.hf_dir}
    export, _ = check_export(args, torch, transformers)
    result["transformers_vs_forge"] = export
    ok = export["ok"]
    if not args.no_numpy:
        result["numpy_vs_transformers"], numpy_ok = numpy_checks(args, torch, transformers)
        ok = ok and numpy_ok
    result["ok"] = ok
    print(json.dumps(result))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
