"""One of `portanet bench`'s training steps (mlp-big, mlp-small, lenet-step, resnet-step) at
the batches given, in each precision: the median step, timed as the bench times a step
(replayed as fit runs it, on a batch already on the device), and the device memory at the
step's peak, counted as the bench counts it (bytes allocated from before the network was
made). With --torch, PyTorch's same network and step beside it (eager; TF32 allowed in tf32,
autocast in bf16 and fp16, fp16's loss scaled by a GradScaler) and its peak
(torch.cuda.max_memory_allocated, from before its model was made). One JSON line a case.

Usage: python bench/step_batches.py WORKLOAD [--device cuda] [--batch 256 --batch 2048]
       [--precision fp32 --precision bf16 ...] [--torch]
"""
import argparse
import json

import numpy as np

from portanet import backends, bench, peer


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("workload", choices=sorted(bench.STEPS))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batch", type=int, action="append",
                        help="default: the bench's batches for the device")
    parser.add_argument("--precision", action="append", help="default: fp32")
    parser.add_argument("--torch", action="store_true", help="PyTorch's step beside it")
    args = parser.parse_args()
    for precision in args.precision or ["fp32"]:
        bk = backends.device(args.device, precision=precision)
        rng = np.random.default_rng(0)
        for m in args.batch or bench.step_batches(args.workload, bk):
            bk.synchronize()
            base = bk.allocated_bytes
            bk.peak_bytes = base
            net, step = bench.training_step(args.workload, bk, m, rng)
            try:
                t = bench._step_timing(bk, step)
            finally:
                peak = bk.peak_bytes - base
                net.free()
            row = {"workload": args.workload, "device": args.device, "precision": precision,
                   "batch": m, "median_ms": round(1e3 * t["median_s"], 4),
                   "min_ms": round(1e3 * t["min_s"], 4), "max_ms": round(1e3 * t["max_s"], 4),
                   "peak_mib": round(peak / 2**20, 1)}
            if args.torch:
                row.update(torch_step(args.workload, bk, m, precision))
            print(json.dumps(row), flush=True)


def torch_step(workload, bk, m, precision):
    torch_device, reason = peer.device_of(bk)
    if not torch_device:
        return {"torch": reason}
    import torch
    cuda = torch_device.startswith("cuda")
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    t = peer.torch_case(workload, f"batch {m}", torch_device, precision=precision)
    out = {"torch_ms": round(1e3 * t["median_s"], 4)}
    if cuda:
        out["torch_peak_mib"] = round((torch.cuda.max_memory_allocated() - before) / 2**20, 1)
    return out


if __name__ == "__main__":
    main()
