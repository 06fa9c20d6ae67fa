# Stand-in for the PyTorch anchor: its JSON line for each MODEL:B:c, at 100 ms a step.
import json, sys
for spec in sys.argv[1:]:
    name, b, comp = spec.split(":")
    b = int(b)
    print(json.dumps(dict(model=name, B=b, T=1024, compile=comp == "c", step_ms=100.0,
                          tokens_per_s=b * 1024 / 0.1, mfu=0.4, peak_mem_gib=22.0, warm_s=60.0)))
