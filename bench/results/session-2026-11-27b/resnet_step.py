"""The ResNet's training step (portanet.models.resnet, 28 x 28 images, SGD with momentum) in
each precision, timed as `portanet bench` times a step (bench._step_timing: replayed as fit
runs it), and the device memory at its peak counted as bench counts it (allocated bytes from
the step's start), for the tree on PYTHONPATH; with TORCH=1 also PyTorch's same network and
step (eager; autocast in bf16 and fp16, fp16's loss scaled) and its peak
(max_memory_allocated). One JSON line a case.
python3 resnet_step.py DEVICE BATCH [BATCH ...]   (PRECISIONS=fp32,bf16,fp16)"""
import json
import os
import sys

import numpy as np

import portanet as pn
from portanet import bench, training


def portanet_step(bk, m, rng):
    net = pn.models.resnet(device=bk)
    x = rng.random((m, 1, 28, 28), dtype=np.float32)
    y, opt = rng.integers(0, 10, m), pn.SGD(0.02, 0.9)
    net.train_batch(x, y, opt)          # sizes the buffers; the batch stays on the device
    return net, lambda: training.train_step(net, opt)


def torch_step(device, m, precision):
    """(seconds per step, peak MiB) of the same network in PyTorch."""
    import contextlib
    import torch
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, c_in, c, stride):
            super().__init__()
            self.inner = nn.Sequential(
                nn.Conv2d(c_in, c, 3, stride, 1), nn.BatchNorm2d(c), nn.ReLU(),
                nn.Conv2d(c, c, 3, 1, 1), nn.BatchNorm2d(c))
            self.proj = nn.Conv2d(c_in, c, 1, stride) if (c_in, stride) != (c, 1) else None

        def forward(self, x):
            return torch.relu(self.inner(x) + (self.proj(x) if self.proj else x))

    layers, c = [nn.Conv2d(1, 32, 3, 1, 1), nn.BatchNorm2d(32), nn.ReLU()], 32
    for w, s in ((32, 1), (32, 1), (64, 2), (64, 1), (128, 2), (128, 1)):
        layers.append(Block(c, w, s))
        c = w
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.3), nn.Linear(128, 10)]
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    model = nn.Sequential(*layers).to(device)
    x = torch.rand(m, 1, 28, 28, device=device)
    y = torch.randint(0, 10, (m,), device=device)
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    autocast = (lambda: torch.autocast("cuda", dtype=half)) if half else contextlib.nullcontext
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    scaler = torch.amp.GradScaler(enabled=precision == "fp16")
    loss_fn = nn.CrossEntropyLoss()

    def step():
        opt.zero_grad()
        with autocast():
            loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    t = bench.measure(step, torch.cuda.synchronize, repeats=10, inner=3)
    return t["median_s"], (torch.cuda.max_memory_allocated() - before) / 2**20


device, batches = sys.argv[1], tuple(int(b) for b in sys.argv[2:])
for precision in os.environ.get("PRECISIONS", "fp32,bf16,fp16").split(","):
    bk = pn.device(device, precision=precision)
    for m in batches:
        bk.synchronize()
        base = bk.allocated_bytes
        bk.peak_bytes = base
        net, step = portanet_step(bk, m, np.random.default_rng(0))
        try:
            t = bench._step_timing(bk, step)
        finally:
            peak = (bk.peak_bytes - base) / 2**20
            net.free()
        row = {"precision": precision, "batch": m, "median_ms": round(1e3 * t["median_s"], 3),
               "peak_mib": round(peak, 1)}
        if os.environ.get("TORCH") == "1":
            s, mib = torch_step(device, m, precision)
            row.update(torch_ms=round(1e3 * s, 3), torch_peak_mib=round(mib, 1))
        print(json.dumps(row), flush=True)
