"""PyTorch's peak device memory on bench's mlp-big step (batch 10000) in each precision, as
portanet bench's peak MiB counts portanet's: the tensors allocated (max_memory_allocated),
from the model's creation through the timed steps (portanet.bench.torch_case, eager)."""
import gc
import json

import torch

from portanet import bench

for precision in ("fp32", "bf16", "fp16"):
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    timing = bench.torch_case("mlp-big", "batch 10000", "cuda", precision=precision)
    peak = torch.cuda.max_memory_allocated() - before
    print(json.dumps({"precision": precision, "peak_mib": round(peak / 2**20, 1),
                      "median_ms": round(1000 * timing["median_s"], 3)
                      if isinstance(timing, dict) and "median_s" in timing else str(timing)[:80]}))
