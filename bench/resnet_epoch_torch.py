"""portanet's ResNet trained in PyTorch on Fashion-MNIST: the peer of

    portanet train --model resnet --optimizer adam --schedule "cosine(10)" --epochs 10 \
        --batch-size 128 --device cuda --json

for comparing epoch times (and, loosely, test accuracy: the initial weights differ).

The architecture is not written here: it is read from portanet at run time (the layers of
`pn.resnet()`, else of the description `portanet.models.RESNET`) and each layer is mapped
to its torch twin (Conv2D -> Conv2d, BatchNorm -> BatchNorm2d/1d with the same momentum
and eps, Residual -> the inner layers plus an identity or 1x1-convolution shortcut, ...),
so a change to portanet's ResNet changes this peer too. Adam (portanet's default rate
unless --lr), the rate of each epoch from portanet's own Cosine schedule, batches of 128
from host NumPy arrays shuffled each epoch, float32 with TF32 off (as portanet computes).
The data comes from portanet.load_dataset("fashion-mnist"), which reads $PORTANET_DATA.

Each epoch is timed between device synchronisations, after a warm-up of a few batches on
a separate copy of the network (CUDA context, cuDNN and cuBLAS handles, allocator).
Prints a line per epoch on stderr and one JSON object on stdout.

Usage: python bench/resnet_epoch_torch.py [--epochs 10] [--limit N] [--device cuda|cpu]
       [--batch-size 128] [--lr LR] [--seed 0] [--json out.json]
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import portanet as pn                                   # noqa: E402
from portanet import models, schedules                  # noqa: E402

WARMUP_BATCHES = 5


def resnet_layers(classes=10):
    """(portanet layer objects, input shape) of portanet's ResNet."""
    if hasattr(pn, "resnet"):
        net = pn.resnet(classes=classes, device="cpu")
        return net.layers, tuple(net.input_shape)
    return models.parse(models.RESNET.format(classes=classes, output="softmax")), (1, 28, 28)


def out_size(n, k, stride, pad):
    return (n + 2 * pad - k) // stride + 1


class Twin:
    """Builds the torch modules of a list of portanet layers, tracking the shape."""

    def __init__(self, torch):
        self.torch = torch
        nn = torch.nn
        self.acts = {"linear": nn.Identity, "softmax": nn.Identity,   # logits for the loss
                     "relu": nn.ReLU, "sigmoid": nn.Sigmoid, "tanh": nn.Tanh,
                     "leaky_relu": lambda: nn.LeakyReLU(0.01), "elu": nn.ELU,
                     "gelu": nn.GELU, "silu": nn.SiLU}

    def sequence(self, layers, shape):
        modules = []
        for layer in layers:
            module, shape = self.layer(layer, shape)
            modules.append(module)
        return self.torch.nn.Sequential(*modules), shape

    def layer(self, layer, shape):
        nn, kind, cfg = self.torch.nn, type(layer).__name__, layer.config()
        act = self.acts[cfg.get("activation", "linear")]()
        if kind == "Dense":
            n_in = math.prod(shape)
            return nn.Sequential(nn.Flatten(), nn.Linear(n_in, cfg["units"]), act), \
                (cfg["units"],)
        if kind == "Conv2D":
            c, h, w = shape
            k, s, p = cfg["kernel_size"], cfg["stride"], cfg["padding"]
            return nn.Sequential(nn.Conv2d(c, cfg["filters"], k, stride=s, padding=p), act), \
                (cfg["filters"], out_size(h, k, s, p), out_size(w, k, s, p))
        if kind in ("MaxPool2D", "AvgPool2D"):
            c, h, w = shape
            pool, s = cfg["pool"], cfg["stride"]
            cls = nn.MaxPool2d if kind == "MaxPool2D" else nn.AvgPool2d
            return cls(pool, s), (c, out_size(h, pool, s, 0), out_size(w, pool, s, 0))
        if kind == "GlobalAvgPool2D":
            return nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten()), (shape[0],)
        if kind == "Flatten":
            return nn.Flatten(), (math.prod(shape),)
        if kind == "Dropout":
            return nn.Dropout(cfg["rate"]), shape
        if kind == "BatchNorm":
            cls = nn.BatchNorm1d if len(shape) == 1 else nn.BatchNorm2d
            return nn.Sequential(cls(shape[0], eps=cfg["eps"], momentum=cfg["momentum"]), act), \
                shape
        if kind == "Residual":
            inner, out = self.sequence(layer.layers, shape)
            return residual_block(self.torch, inner, self.shortcut(shape, out), act), out
        raise SystemExit(f"resnet_epoch_torch.py: no torch twin for portanet's {kind} layer")

    def shortcut(self, shape, out):
        """portanet's: the input where the shapes agree, else a 1x1 convolution with the
        stride that makes them agree (Dense for vectors)."""
        nn = self.torch.nn
        if out == shape:
            return nn.Identity()
        if len(shape) == 1:
            return nn.Linear(shape[0], out[0])
        stride = next(s for s in range(1, max(shape[1:]) + 1)
                      if (out_size(shape[1], 1, s, 0), out_size(shape[2], 1, s, 0)) == out[1:])
        return nn.Conv2d(shape[0], out[0], 1, stride=stride)


def residual_block(torch, inner, shortcut, act):
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner, self.shortcut, self.act = inner, shortcut, act

        def forward(self, x):
            return self.act(self.inner(x) + self.shortcut(x))
    return Block()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--limit", type=int, default=None, help="train on the first N samples")
    parser.add_argument("--device", default=None, help="cuda (default where there is one) or cpu")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=None,
                        help="Adam's rate of the first epoch (default: portanet's Adam's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="also write the result to this file")
    args = parser.parse_args()
    if args.epochs < 1 or args.batch_size < 1 or (args.limit is not None and args.limit < 1):
        parser.error("--epochs, --batch-size and --limit must be at least 1")

    import torch
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(args.seed)
    lr = args.lr if args.lr is not None else (pn.Adam().lr if hasattr(pn, "Adam") else 1e-3)
    schedule = schedules.Cosine(args.epochs)

    (x, y), (x_test, y_test) = pn.load_dataset("fashion-mnist")
    x, y = x[:args.limit], y[:args.limit]
    layers, in_shape = resnet_layers(classes=int(y.max()) + 1)

    def build():
        model, out = Twin(torch).sequence(layers, in_shape)
        return model.to(device)

    def sync():
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    loss_fn = torch.nn.CrossEntropyLoss()

    def step(model, opt, idx):
        xb = torch.from_numpy(x[idx]).to(device, non_blocking=True)
        yb = torch.from_numpy(y[idx]).to(device, non_blocking=True)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(xb), yb)
        loss.backward()
        opt.step()
        return loss.detach()

    warm = build()                              # the first launches, not timed
    warm_opt = torch.optim.Adam(warm.parameters(), lr=lr)
    for i in range(WARMUP_BATCHES):
        step(warm, warm_opt, np.arange(i * args.batch_size, (i + 1) * args.batch_size) % len(x))
    sync()
    del warm, warm_opt

    model = build()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    rng = np.random.default_rng(args.seed)
    seconds, losses, rates = [], [], []
    for epoch in range(args.epochs):
        rate = schedule(epoch, lr)
        for group in opt.param_groups:
            group["lr"] = rate
        model.train()
        order = rng.permutation(len(x))
        total = torch.zeros((), device=device)
        sync()
        start = time.perf_counter()
        for i in range(0, len(x), args.batch_size):
            idx = order[i:i + args.batch_size]
            total += step(model, opt, idx) * len(idx)
        sync()
        seconds.append(time.perf_counter() - start)
        losses.append(total.item() / len(x))
        rates.append(rate)
        print(f"epoch {epoch + 1}/{args.epochs}: {seconds[-1]:.2f} s, lr {rate:.6g}, "
              f"loss {losses[-1]:.4f}", file=sys.stderr, flush=True)

    model.eval()
    hits = 0
    with torch.no_grad():
        for i in range(0, len(x_test), 1000):
            logits = model(torch.from_numpy(x_test[i:i + 1000]).to(device))
            hits += int((logits.argmax(1).cpu().numpy() == y_test[i:i + 1000]).sum())
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"), "library": "torch",
        "torch": torch.__version__, "portanet": pn.__version__, "device": device,
        "device_name": torch.cuda.get_device_name() if device.startswith("cuda") else "cpu",
        "model": "resnet", "layers": [repr(layer) for layer in layers],
        "parameters": sum(p.numel() for p in model.parameters()),
        "dataset": "fashion-mnist", "train_samples": len(x), "epochs": args.epochs,
        "batch_size": args.batch_size, "optimizer": "adam", "lr": lr,
        "schedule": f"cosine({args.epochs})", "tf32": False, "epoch_seconds": seconds,
        "median_epoch_seconds": float(np.median(seconds)), "lrs": rates,
        "train_loss": losses, "test_accuracy": hits / len(x_test),
    }
    print(json.dumps(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
