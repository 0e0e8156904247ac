"""One eager ResNet training step traced launch by launch (portanet.profiler, as `portanet
profile` traces bench's workloads) for the tree on PYTHONPATH: the table, and the device time
summed by kernel label.
python3 resnet_profile.py DEVICE BATCH PRECISION"""
import collections
import sys

import numpy as np

import portanet as pn
from portanet import profiler, training

device, m, precision = sys.argv[1], int(sys.argv[2]), sys.argv[3]
bk = pn.device(device, precision=precision)
rng = np.random.default_rng(0)
net = pn.models.resnet(device=bk)
x, y, opt = rng.random((m, 1, 28, 28), dtype=np.float32), rng.integers(0, 10, m), pn.SGD(0.02, 0.9)
net.train_batch(x, y, opt)
report = profiler.profile(bk, lambda: training.step(net, opt), warmup_seconds=0.5)
print(profiler.table(report))
by = collections.defaultdict(lambda: [0, 0.0])
for call in report["calls"]:
    key = call["call"].split(" ")[0]
    by[key][0] += 1
    by[key][1] += call["device_us"]
for key, (n, us) in sorted(by.items(), key=lambda kv: -kv[1][1]):
    print(f"{key:40s} {n:4d} {us:10.1f} us")
