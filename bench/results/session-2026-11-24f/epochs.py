"""The LeNet / MLP epoch from host arrays, us a batch, with the data sent per batch
(staged) or kept on the device (data_on_device=True); parts on the host by wrappers."""
import sys, time, collections, functools
import numpy as np
import portanet as pn
from portanet import training
from portanet.backends import opencl

spent = collections.Counter()

def wrap(owner, name, label):
    f = getattr(owner, name)
    @functools.wraps(f)
    def w(*a, **k):
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            spent[label] += time.perf_counter() - t
    setattr(owner, name, w)

def run(device, model, mode, samples=int(__import__("os").environ.get("SAMPLES", 20000)), batch=64, rounds=4):
    (x, y), _ = pn.load_dataset("fashion-mnist")
    x, y = x[:samples], y[:samples]
    net = (pn.lenet if model == "lenet" else pn.mlp)(device=device, seed=0)
    bk = net.backend
    net.fit(x[:batch * 20], y[:batch * 20], epochs=1, batch_size=batch, data_on_device=mode)
    batches = -(-len(x) // batch)
    spent.clear()
    bk.synchronize()
    h = net.fit(x, y, epochs=rounds, batch_size=batch, data_on_device=mode)
    out = [s / batches * 1e6 for s in h["seconds"]]
    parts = ", ".join(f"{k} {v / batches / rounds * 1e6:.0f}" for k, v in spent.most_common())
    print(f"{model:5s} {device:11s} data_on_device={mode!s:5s} us a batch: "
          + " ".join(f"{v:.1f}" for v in out) + f"   [last: {parts}]", flush=True)

wrap(training, "train_step", "train_step")
wrap(opencl._HostReplay, "__call__", "cl replay")
wrap(pn.Sequential, "_stage_batch", "stage")
for device in sys.argv[1].split(","):
    for model in sys.argv[2].split(","):
        for mode in (False, True):
            run(device, model, mode)
