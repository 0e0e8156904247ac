"""LeNet training epoch on Fashion-MNIST, portanet against PyTorch (float32 eager, TF32
off), same architecture (conv 16 3x3 relu, conv 32 3x3 relu, maxpool 2, dense 10,
softmax cross-entropy), batch size and optimizer (SGD, lr 0.02, momentum 0.9). Both
libraries are given the training set as host NumPy arrays, as a training loop is:
portanet in one fit(epochs=N) call (each epoch's seconds from its history), which by
default keeps the set on a GPU and gathers the batches there; PyTorch takes each shuffled
batch from the arrays.

Usage: python bench/lenet_epoch.py [--devices cuda,opencl] [--epochs 3] [--json out.json]
       [--data-on-device auto|true|false]   (fit's data_on_device; default auto)
"""
import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import portanet as pn                                   # noqa: E402

BATCH, LR, MOMENTUM = 64, 0.02, 0.9


def portanet_epochs(spec, x, y, xt, yt, epochs, on_device="auto"):
    """The epochs' seconds of one fit (the first includes the set's upload, where it goes
    up, and recording the step); kernels are built and products routed before."""
    net = pn.lenet(device=spec, seed=0)
    net.fit(x[:BATCH * 20], y[:BATCH * 20], epochs=2, batch_size=BATCH,   # warm-up: builds
            data_on_device=on_device, verbose=0)
    net = pn.lenet(device=spec, seed=0)
    history = net.fit(x, y, epochs=epochs, batch_size=BATCH, optimizer=pn.SGD(LR, MOMENTUM),
                      data_on_device=on_device, verbose=0)
    return {"epoch_seconds": history["seconds"], "test_accuracy": net.evaluate(xt, yt)[1]}


def torch_epochs(x, y, xt, yt, epochs):
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 16, 3), torch.nn.ReLU(), torch.nn.Conv2d(16, 32, 3), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(32 * 12 * 12, 10)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    loss_fn = torch.nn.CrossEntropyLoss()

    def epoch(seed, limit=None):
        order = np.random.default_rng(seed).permutation(len(x))[:limit]
        for i in range(0, len(order), BATCH):
            idx = order[i:i + BATCH]
            xb = torch.from_numpy(x[idx]).cuda()
            yb = torch.from_numpy(y[idx]).cuda()
            opt.zero_grad()
            loss_fn(model(xb), yb).backward()
            opt.step()
    epoch(99, BATCH * 20)                       # warm-up: cuDNN autotuning, allocations
    times = []
    for e in range(epochs):
        torch.cuda.synchronize()
        start = time.perf_counter()
        epoch(e)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    with torch.no_grad():
        pred = torch.cat([model(torch.from_numpy(xt[i:i + 1000]).cuda()).argmax(1)
                          for i in range(0, len(xt), 1000)]).cpu().numpy()
    return {"epoch_seconds": times, "test_accuracy": float(np.mean(pred == yt))}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--devices", default="cuda,opencl")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--json", default=None)
    parser.add_argument("--data-on-device", default="auto", choices=["auto", "true", "false"])
    parser.add_argument("--no-torch", action="store_true", help="skip PyTorch's epochs")
    args = parser.parse_args()
    (x, y), (xt, yt) = pn.load_dataset("fashion-mnist")
    results = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "batch_size": BATCH, "runs": {}}
    for spec in args.devices.split(","):
        try:
            results["runs"][spec] = portanet_epochs(
                spec, x, y, xt, yt, args.epochs,
                {"auto": "auto", "true": True, "false": False}[args.data_on_device])
        except Exception as e:
            results["runs"][spec] = {"error": f"{type(e).__name__}: {e}"}
        print(spec, results["runs"][spec], flush=True)
    if not args.no_torch:
        try:
            import torch
            results["torch_version"] = torch.__version__
            results["runs"]["torch"] = torch_epochs(x, y, xt, yt, args.epochs)
        except Exception as e:
            results["runs"]["torch"] = {"error": f"{type(e).__name__}: {e}"}
        print("torch", results["runs"]["torch"], flush=True)
    ref = min(results["runs"].get("torch", {}).get("epoch_seconds", [float("nan")]))
    print(f"\n{'impl':10s} {'best epoch s':>13s} {'vs torch':>9s} {'test acc':>9s}")
    for impl, r in results["runs"].items():
        if "error" in r:
            print(f"{impl:10s} FAILED {r['error'][:70]}")
            continue
        best = min(r["epoch_seconds"])
        print(f"{impl:10s} {best:13.3f} {best / ref:8.3f}x {r['test_accuracy']:9.4f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
