"""A CNN's first training step in bf16 on cuda, batch 256: LeNet (the tree before 78b74ea
met an illegal memory access there), or with BN=1 one whose convolutions store float32
(BatchNorm reads them). Prints ok or raises."""
import os

import numpy as np

import portanet as pn

desc = ("conv(16, 3) batchnorm(relu) conv(32, 3) batchnorm(relu) maxpool(2) flatten "
        "dense(10, softmax)") if os.environ.get("BN") == "1" else \
    "conv(16, 3, relu) conv(32, 3, relu) maxpool(2) flatten dense(10, softmax)"
net = pn.from_description(desc, (1, 28, 28), device="cuda", precision="bf16")
rng = np.random.default_rng(0)
x = rng.random((256, 1, 28, 28), dtype=np.float32)
y = rng.integers(0, 10, 256)
for _ in range(3):
    net.train_batch(x, y, pn.SGD(0.02, 0.9))
net.backend.synchronize()
print("ok", desc, os.environ.get("PORTANET_GRAPHS", "on"))
