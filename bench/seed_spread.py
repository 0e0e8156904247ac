"""Test accuracy of the Fashion-MNIST LeNet of bench/lenet_compare.py after a few epochs,
for several seeds (the weights' and the shuffle's), on each device: how far two runs
that differ only in the order of float sums (another kernel, another device) land apart,
beside how far seeds do. Run it with the portanet to measure on PYTHONPATH (a tree before
a change and after it).

Usage: python bench/seed_spread.py [--devices cuda,opencl:0:0] [--seeds 5] [--epochs 2]
       [--json out.json]
"""
import argparse
import json
import time

import numpy as np

import portanet as pn

BATCH, LR, MOMENTUM = 64, 0.02, 0.9


def accuracy(spec, seed, epochs, data):
    (x, y), (xt, yt) = data
    net = pn.lenet(device=spec, seed=seed)
    try:
        net.fit(x, y, epochs=epochs, batch_size=BATCH, optimizer=pn.SGD(LR, MOMENTUM),
                seed=seed)
        return net.evaluate(xt, yt)[1]
    finally:
        net.free()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--devices", default="cuda,opencl:0:0")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    data = pn.load_dataset("fashion-mnist")
    results = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "epochs": args.epochs,
               "portanet": pn.__file__, "accuracy": {}}
    for spec in args.devices.split(","):
        accs = [accuracy(spec, s, args.epochs, data) for s in range(args.seeds)]
        results["accuracy"][spec] = accs
        print(f"{spec:12s} " + " ".join(f"{a:.4f}" for a in accs)
              + f"   mean {np.mean(accs):.4f} sd {np.std(accs, ddof=1):.4f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
