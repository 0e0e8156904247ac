"""Runs portanet's CUDA backend over the pycuda stand-in (this folder first on sys.path):
builds, copies, launches, recorded steps and tensor-core paths of each precision. Prints
one JSON line: the launches made per kernel. Any error ends it with a traceback."""
import ctypes
import json
import sys
import tempfile
import threading
from collections import Counter

import numpy as np

_real_cdll = ctypes.CDLL


class _Driver:
    """libcuda's calls the backend makes through ctypes (graphs, tensor maps): succeed."""
    captures = 0

    def __getattr__(self, name):
        def call(*args):
            if name == "cuStreamBeginCapture_v2":
                _Driver.captures += 1
            return 0
        call.argtypes = call.restype = None
        setattr(self, name, call)
        return call


def _cdll(name, *args, **kwargs):
    if str(name).startswith("libcuda"):
        return _Driver()
    return _real_cdll(name, *args, **kwargs)


ctypes.CDLL = _cdll

import portanet as pn                           # noqa: E402
from portanet import profiler                   # noqa: E402
from pycuda import compiler, driver             # noqa: E402


def exercise(precision):
    rng = np.random.default_rng(0)
    bk = pn.device("cuda", precision=precision)
    host = rng.standard_normal((37, 29)).astype(np.float32)
    x = bk.upload(host)
    assert np.array_equal(bk.download(x), host), "a copy up and down changed the data"
    bk.free(x)
    images = rng.standard_normal((96, 1, 28, 28)).astype(np.float32)
    labels = rng.integers(0, 10, 96)
    for make, optimizer in ((pn.mlp, pn.SGD(0.01, momentum=0.9)), (pn.lenet, pn.Adam(1e-3)),
                            (pn.resnet, pn.AdamW(1e-3))):
        shape = (784,) if make is pn.mlp else (1, 28, 28)
        data = images.reshape(96, -1) if make is pn.mlp else images
        net = make(input_shape=shape, device="cuda", precision=precision)
        net.fit(data, labels, epochs=2, batch_size=32, optimizer=optimizer,
                validation_data=(data[:40], labels[:40]))
        net.predict(data[:50])
        net.evaluate(data, labels, batch_size=40)
        with tempfile.TemporaryDirectory() as folder:
            net.save(f"{folder}/net.safetensors")
            net.load_weights(f"{folder}/net.safetensors")
        if make is pn.lenet:
            step = lambda: net.train_batch(data[:32], labels[:32], optimizer)  # noqa: E731
            assert profiler.profile(bk, step)["calls"]
            failed = []

            def predict():                      # another thread: its own context push
                try:
                    net.predict(data[:8])
                except BaseException as e:
                    failed.append(e)
            thread = threading.Thread(target=predict)
            thread.start()
            thread.join()
            if failed:
                raise failed[0]
        net.free()


for precision in sys.argv[1:] or ["fp32", "tf32", "bf16", "fp16"]:
    exercise(precision)
from nvmath.bindings import cublas   # noqa: E402

print(json.dumps({"captures": _Driver.captures, "cublas": Counter(cublas.calls),
                  "launches": Counter(name for name, _, _ in compiler.launches),
                  "allocations_left": len(driver.Memory.blocks)}))
