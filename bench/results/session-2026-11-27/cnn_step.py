"""LeNet's training step (bench's lenet-step) at larger batches, in each precision: the
median time of a step (replayed as fit runs it) and the device memory at its peak, counted
as `portanet bench` counts it (allocated bytes from the step's start), for the tree on
PYTHONPATH; with TORCH=1 also PyTorch's same step (eager, autocast in bf16 and fp16) and
its peak (max_memory_allocated). One JSON line a case.
python3 cnn_step.py DEVICE BATCH [BATCH ...]   (PRECISIONS=fp32,bf16,fp16)"""
import json
import os
import sys

import numpy as np

import portanet as pn
from portanet import bench

device, batches = sys.argv[1], tuple(int(b) for b in sys.argv[2:])
bench.step_batches = lambda workload, bk: batches
for precision in os.environ.get("PRECISIONS", "fp32,bf16,fp16").split(","):
    bk = pn.device(device, precision=precision)
    for case, run in bench.wl_lenet_step(bk, np.random.default_rng(0)):
        bk.synchronize()
        base = bk.allocated_bytes
        bk.peak_bytes = base
        t = run()
        row = {"precision": precision, "case": case, "median_ms": round(1e3 * t["median_s"], 4),
               "peak_mib": round((bk.peak_bytes - base) / 2**20, 1)}
        if os.environ.get("TORCH") == "1":
            import torch
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            tt = bench.torch_case("lenet-step", case, device, precision=precision)
            row.update(torch_ms=round(1e3 * tt["median_s"], 4),
                       torch_peak_mib=round((torch.cuda.max_memory_allocated() - before)
                                            / 2**20, 1))
        print(json.dumps(row), flush=True)
