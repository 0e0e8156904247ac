"""gemv's row groups on a CPU device at GPU size (256 work-items) and CPU size (32): a
Fashion-MNIST MLP (784-512-256-10) epoch of N images, batch 64, SGD, one seed, after a
warm-up fit; one process per size (the groups' size is set as the backend is made, before
any kernel is built), two epochs each. Seconds an epoch and test accuracy on 2000 images.

    python3 cpu_gemv_threads.py DEVICE N THREADS
"""
import sys
import time
import warnings

from portanet.backends import opencl

warnings.filterwarnings("ignore")
threads = int(sys.argv[3])
made = opencl.OpenCLBackend.__init__


def made_with(self, *args, **kwargs):
    made(self, *args, **kwargs)
    self.gemv_threads = threads


opencl.OpenCLBackend.__init__ = made_with
import portanet as pn                   # noqa: E402

spec, n = sys.argv[1], int(sys.argv[2])
(x, y), (xt, yt) = pn.load_dataset("fashion-mnist")
x, y = x[:n], y[:n]
pn.mlp((1, 28, 28), 10, device=spec, seed=0).fit(x[:640], y[:640], epochs=1, batch_size=64)
for _ in range(2):
    net = pn.mlp((1, 28, 28), 10, device=spec, seed=0)
    t = time.perf_counter()
    net.fit(x, y, epochs=1, batch_size=64)
    print(f"{spec} gemv_threads {threads}: {time.perf_counter() - t:.2f} s an epoch, test "
          f"accuracy {net.evaluate(xt[:2000], yt[:2000])[1]:.4f}", flush=True)
