#!/usr/bin/env python3
"""Hugging Face transformers' greedy generation speed on the shapes forge-generate-bench runs.

  hf_generate_anchor.py [--model gpt350m,llama3-1b] [--batch 1,32] [--prompt-len 128]
                        [--new-tokens 128] [--cache static|dynamic] [--repeat 3]

One JSON line per (model, batch), with forge-generate-bench's keys: a LlamaForCausalLM of the
preset's shape (Forge's gpt350m and llama3-1b are Llama-architecture models) in BF16 on the
GPU, randomly initialised (speed does not depend on the values), B prompts of --prompt-len
random tokens, model.generate(do_sample=False) forced to exactly --new-tokens tokens. With
--cache static (default) transformers preallocates the KV cache and compiles the decode step
(its documented fast path); the compile happens in the untimed warm-up. The prefill time is a
generate of one new token; decode = the full generate minus it.
"""
import argparse
import json
import sys
import time

# Forge's presets (src/common/config.cc): layers, d_model, heads, kv heads, ffn, vocab.
PRESETS = {
    "gpt124m": (12, 768, 12, 12, 2048, 50257),
    "gpt350m": (24, 1024, 16, 16, 2816, 50257),
    "llama3-1b": (16, 2048, 32, 8, 8192, 128256),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="gpt350m,llama3-1b")
    ap.add_argument("--batch", default="1,32")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--cache", choices=["static", "dynamic"], default="static")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    try:
        import torch
        import transformers
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as e:
        print(json.dumps({"error": f"hf_generate_anchor: {e}"}))
        return 1
    dev = torch.device("cuda")
    for name in args.model.split(","):
        if name not in PRESETS:
            print(json.dumps({"error": f"hf_generate_anchor: unknown model {name}"}))
            return 1
        L, d, H, KV, ffn, vocab = PRESETS[name]
        cfg = LlamaConfig(vocab_size=vocab, hidden_size=d, intermediate_size=ffn,
                          num_hidden_layers=L, num_attention_heads=H, num_key_value_heads=KV,
                          head_dim=d // H, max_position_embeddings=8192, rms_norm_eps=1e-5,
                          tie_word_embeddings=True, rope_theta=500000.0 if vocab > 100000
                          else 10000.0, pad_token_id=0, bos_token_id=1, eos_token_id=2)
        torch.manual_seed(0)
        with dev:
            model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
        for B in (int(b) for b in args.batch.split(",")):
            g = torch.Generator(device="cpu").manual_seed(B)
            ids = torch.randint(3, vocab, (B, args.prompt_len), generator=g).to(dev)
            mask = torch.ones_like(ids)

            def run(n):
                torch.cuda.synchronize()
                t = time.perf_counter()
                with torch.inference_mode():
                    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n,
                                         min_new_tokens=n, do_sample=False,
                                         cache_implementation=args.cache, pad_token_id=0)
                torch.cuda.synchronize()
                assert out.shape[1] == args.prompt_len + n, out.shape
                return time.perf_counter() - t

            for _ in range(args.warmup):
                run(args.new_tokens)
                run(1)
            total = min(run(args.new_tokens) for _ in range(args.repeat))
            prefill = min(run(1) for _ in range(args.repeat))
            decode = max(total - prefill, 1e-9)
            new = B * args.new_tokens
            print(json.dumps({
                "bench": "generate", "model": name, "B": B, "prompt_len": args.prompt_len,
                "new_tokens": args.new_tokens, "backend": f"transformers-{args.cache}",
                "prefill_s": prefill, "prefill_tokens_per_s": B * args.prompt_len / prefill,
                "decode_s": decode,
                "decode_ms_per_step": 1e3 * decode / max(1, args.new_tokens - 1),
                "decode_tokens_per_s": (new - B) / decode, "tokens_per_s": new / total,
                "torch": torch.__version__, "transformers": transformers.__version__}),
                flush=True)
        del model
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
