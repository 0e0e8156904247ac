"""SGD's update on CPU OpenCL devices, the two ways inside one process, alternating: all
layers in one momentum_updates launch of STEPS elements a work-item (the GPUs' way, the only
one before this session), and momentum_update's launch a layer of one element a work-item
(CPUs' way now). Fashion-MNIST's MLP (784-512-256-10) and LeNet, batch 64, SGD 0.02 with
momentum 0.9, an epoch of N images per fit from one seed; seconds an epoch and test accuracy.

    python3 cpu_updates_ab.py DEVICE [N] [ROUNDS]
"""
import sys
import time
import warnings

import portanet as pn

warnings.filterwarnings("ignore")
spec = sys.argv[1]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 20000
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 2
(x, y), (xt, yt) = pn.load_dataset("fashion-mnist")
x, y, xt, yt = x[:n], y[:n], xt[:2000], yt[:2000]
bk = pn.device(spec)
print(f"{spec}: {bk.device_text()}, {n} images an epoch", flush=True)
for model in ("mlp", "lenet"):
    make = (lambda: pn.mlp((1, 28, 28), 10, device=bk, seed=0)) if model == "mlp" else \
        (lambda: pn.lenet(device=bk, seed=0))
    net = make()
    net.fit(x[:640], y[:640], epochs=1, batch_size=64)          # builds and routes first
    for r in range(rounds):
        for fused in (True, False):
            bk.fused_updates = fused
            net = make()
            t = time.perf_counter()
            net.fit(x, y, epochs=1, batch_size=64, optimizer=pn.SGD(0.02, 0.9))
            s = time.perf_counter() - t
            acc = net.evaluate(xt, yt)[1]
            way = "momentum_updates, one launch" if fused else "momentum_update a layer"
            print(f"  {model:5s} round {r + 1}  {way:30s} {s:7.2f} s an epoch  test accuracy "
                  f"{acc:.4f}", flush=True)
