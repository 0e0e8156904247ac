"""Fashion-MNIST test accuracy over seeds: `portanet train`'s LeNet or MLP trained with SGD
0.02, momentum 0.9, batch 64, for each device, precision and seed (the weights' and the
shuffle's), all in one process. It says how far runs land apart that differ only in the
order of float sums (another precision, another device, another tree on PYTHONPATH, or
PORTANET_GEMM=vendor against the routed products), beside how far seeds do.

With --torch the same runs are PyTorch's, on CUDA, with PyTorch's own initialisation: the
same layers, optimizer, batches and epochs, tf32 as `allow_tf32`, bf16 and fp16 under
autocast, fp16's loss scaled by a GradScaler; the peer's own spread beside portanet's.

Prints one JSON line a run, then for each device, model and precision the accuracies, their
mean and standard deviation, and each seed's difference from fp32 of the same seed in
percentage points.

Usage: python bench/seed_accuracy.py [--device cuda] [--device opencl:0:0] [--seeds 0-9]
       [--model lenet] [--model mlp] [--precision fp32 ...] [--epochs 5] [--json out.jsonl]
       [--limit N]   (train on the first N images only: a quick check, not a measurement)
       [--torch]
"""
import argparse
import json
import time

import numpy as np

import portanet as pn

BATCH, LR, MOMENTUM = 64, 0.02, 0.9


def seeds(text):
    """'0-9' or '0,3,5' -> a list of ints."""
    if "-" in text:
        first, last = text.split("-")
        return list(range(int(first), int(last) + 1))
    return [int(s) for s in text.split(",")]


def run(device, model, precision, seed, epochs, data):
    """One training run, as `portanet train --model M --seed S` builds and trains it."""
    (x, y), (xt, yt) = data
    start = time.perf_counter()
    net = pn.models.MODELS[model](input_shape=x.shape[1:], classes=10, device=device,
                                  seed=seed, precision=precision)
    try:
        history = net.fit(x, y, epochs=epochs, batch_size=BATCH,
                          optimizer=pn.SGD(LR, MOMENTUM), seed=seed, verbose=0)
        accuracy = net.evaluate(xt, yt)[1]
    finally:
        net.free()
    return {"device": device, "model": model, "precision": precision, "seed": seed,
            "epochs": epochs, "test_accuracy": accuracy,
            "skipped": history.get("skipped_steps"),
            "seconds": round(time.perf_counter() - start, 1)}


def torch_run(model, precision, seed, epochs, data):
    """One training run of the same network in PyTorch on CUDA."""
    import torch
    nn = torch.nn
    (x, y), (xt, yt) = ((torch.from_numpy(np.ascontiguousarray(a)).cuda() for a in part)
                        for part in data)
    start = time.perf_counter()
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = \
        precision == "tf32"
    torch.manual_seed(seed)
    net = (nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256),
                         nn.ReLU(), nn.Linear(256, 10)) if model == "mlp" else
           nn.Sequential(nn.Conv2d(1, 16, 3), nn.ReLU(), nn.Conv2d(16, 32, 3), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Flatten(), nn.Linear(32 * 12 * 12, 10))).cuda()
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM)
    scaler = torch.amp.GradScaler("cuda", enabled=precision == "fp16")
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    autocast = lambda: torch.autocast("cuda", dtype=half or torch.float32,   # noqa: E731
                                      enabled=half is not None)
    loss_fn = nn.CrossEntropyLoss()
    rng = np.random.default_rng(seed)
    for _ in range(epochs):
        order = torch.from_numpy(rng.permutation(len(y))).cuda()
        for i in range(0, len(y), BATCH):
            idx = order[i:i + BATCH]
            with autocast():
                loss = loss_fn(net(x[idx]), y[idx])
            opt.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
    with torch.no_grad(), autocast():
        right = sum((net(xt[i:i + 1000]).argmax(1) == yt[i:i + 1000]).sum().item()
                    for i in range(0, len(yt), 1000))
    return {"device": "torch", "model": model, "precision": precision, "seed": seed,
            "epochs": epochs, "test_accuracy": right / len(yt),
            "seconds": round(time.perf_counter() - start, 1)}


def summary(rows):
    groups = {}
    for r in rows:
        groups.setdefault((r["device"], r["model"], r["precision"]), {})[r["seed"]] = \
            r["test_accuracy"]
    for (device, model, precision), accs in groups.items():
        values = list(accs.values())
        line = (f"{device:12s} {model:6s} {precision:5s} "
                + " ".join(f"{a:.4f}" for a in values)
                + f"   mean {np.mean(values):.4f}"
                + (f" sd {np.std(values, ddof=1):.4f}" if len(values) > 1 else ""))
        fp32 = groups.get((device, model, "fp32"))
        if precision != "fp32" and fp32:
            diffs = [100 * (a - fp32[s]) for s, a in accs.items() if s in fp32]
            line += ("   from fp32, pp: " + " ".join(f"{d:+.2f}" for d in diffs)
                     + f" (mean {np.mean(diffs):+.2f})")
        print(line)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", action="append", help="default: cuda")
    parser.add_argument("--seeds", default="0-4", help="'0-9' or '0,1,2' (default 0-4)")
    parser.add_argument("--model", action="append", choices=["lenet", "mlp"],
                        help="default: lenet")
    parser.add_argument("--precision", action="append", help="default: fp32")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--json", default=None, help="also write the JSON lines here")
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--torch", action="store_true", help="PyTorch's runs instead")
    args = parser.parse_args()
    (x, y), test = pn.load_dataset("fashion-mnist")
    data = (x[:args.limit], y[:args.limit]), test
    rows = []
    for device in ["torch"] if args.torch else args.device or ["cuda"]:
        for model in args.model or ["lenet"]:
            for seed in seeds(args.seeds):
                for precision in args.precision or ["fp32"]:
                    rows.append(torch_run(model, precision, seed, args.epochs, data)
                                if args.torch else
                                run(device, model, precision, seed, args.epochs, data))
                    print(json.dumps(rows[-1]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    summary(rows)


if __name__ == "__main__":
    main()
