"""The host time of each launch of the recorded LeNet step, inside fit's epochs
(data_on_device as given), beside the kernel's argument count."""
import sys, time, collections
import numpy as np
import pyopencl as cl
import portanet as pn
from portanet.backends import opencl

spent, count, names = collections.defaultdict(float), collections.Counter(), {}
def timed_call(self):
    bk = self.backend
    handle = bk.queue.int_ptr
    for i, op in enumerate(self.ops):
        t = time.perf_counter()
        if isinstance(op, opencl._Launch):
            self.enqueue(handle, op.handle, op.dims, None, op.global_size, op.local_size, 0,
                         None, None)
            names[i] = (op.kernel.function_name, op.kernel.get_info(cl.kernel_info.NUM_ARGS))
        else:
            op(bk.queue)
            names[i] = ("vendor", 0)
        spent[i] += time.perf_counter() - t
        count[i] += 1
opencl._HostReplay.__call__ = timed_call

model, mode = sys.argv[1], sys.argv[2] == "device"
(x, y), _ = pn.load_dataset("fashion-mnist")
x, y = x[:20000], y[:20000]
net = (pn.lenet if model == "lenet" else pn.mlp)(device=__import__("os").environ.get("DEV", "opencl:0:0"), seed=0)
net.fit(x[:1280], y[:1280], epochs=1, batch_size=64, data_on_device=mode)
spent.clear(); count.clear()
h = net.fit(x, y, epochs=3, batch_size=64, data_on_device=mode)
print(f"{model}, data on device {mode}: us a batch " +
      " ".join(f"{s / 313 * 1e6:.1f}" for s in h["seconds"]))
total = 0
for i in sorted(spent):
    us = spent[i] / count[i] * 1e6
    total += us
    print(f"  {i + 1:2d} {names[i][0]:24s} {names[i][1]:3d} args  {us:6.1f} us")
print(f"  replay: {total:.1f} us")
