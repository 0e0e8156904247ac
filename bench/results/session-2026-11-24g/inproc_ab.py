"""The LeNet epoch (60000 Fashion-MNIST images, batch 64, the set on the device as fit
keeps it by default) with this session's two fusions off and on, alternating inside one
process, so that the process's own speed (its core, its routes) is the same for both:
'old' gathers inputs and labels in two launches and forms the output bias gradient by
gemv after the loss kernel; 'new' takes one launch for each pair."""
import sys, time
import numpy as np
import portanet as pn
from portanet.backends import base, gpu

dev = sys.argv[1]
(x, y), _ = pn.load_dataset("fashion-mnist")
net = pn.lenet(device=dev, seed=0)
bk = net.backend
net.fit(x[:1280], y[:1280], epochs=2, batch_size=64)          # builds, routes
key = ("bias_softmax_xent_grad", 10, 64)
print(dev, "routed:", bk._routes.get(key), flush=True)
fused_gather = gpu.KernelBackend.gather_batch
for rnd in range(3):
    for mode in ("old", "new"):
        gpu.KernelBackend.gather_batch = base.Backend.gather_batch if mode == "old" else fused_gather
        bk._routes[key] = "apart" if mode == "old" else "fused"
        net._graphs.clear()
        h = net.fit(x, y, epochs=3, batch_size=64)
        print(f"{dev} round {rnd + 1} {mode}: epoch seconds " +
              " ".join(f"{s:.3f}" for s in h["seconds"]), flush=True)
