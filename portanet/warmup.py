"""`portanet warmup`: build ahead of time what a device will build on first use, so that a
first training there compiles nothing (a container image, or each node of a cluster before
a job). The binaries land where the drivers cache them (`backend.cache_dir`) and are found
there by every later process of the same user, portanet version and driver."""
import logging
import sys
import time

import numpy as np

from . import backends, progress

log = logging.getLogger("portanet")


def warmup(device, precision=None, models=(), batch_sizes=(64,), say=None):
    """Build, on the device string `device` in `precision` (None: the default), every kernel
    family (KernelBackend.build_all: each family, its 16-bit storage build where the
    precision stores 16 bits, the backend's own), several at once, with a progress bar on
    stderr where a person watches it, else a line per build through `say` (default:
    stderr); then, for each model name of `models` (models.MODELS or a description), one
    training step, an evaluation and a prediction at each of `batch_sizes` on random
    images shaped as `portanet train`'s (1 x 28 x 28, 10 classes), or for "gpt" random
    windows of the bench's baby GPT (models.GPT_STEP) trained with AdamW: the GEMM,
    convolution and attention builds that follow its shapes (a training's last, smaller
    batch has its own). Returns (builds made, seconds); (0, 0.0) on the cpu, which builds
    nothing."""
    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    bk = backends.device(device, precision=precision)
    if not hasattr(bk, "build_all"):
        say(f"{bk.name}: nothing to build (the NumPy reference runs no kernels)")
        return 0, 0.0
    start = time.perf_counter()
    builds = bk.builds()
    where = f"{bk.name} {bk.precision}"
    tqdm = progress._tqdm() if progress.watched(sys.stderr) else None
    if tqdm is not None:
        bar = tqdm(total=len(builds), desc=f"{where}: building", unit="build",
                   file=sys.stderr, dynamic_ncols=True)
        done = lambda build: bar.update(1)        # noqa: E731
    else:
        bar = None
        counter = iter(range(1, len(builds) + 1))
        done = lambda build: say(f"{where}: built {next(counter)}/{len(builds)} "  # noqa
                                 f"{build_text(build)}")
    try:
        bk.build_all(done)
    finally:
        if bar is not None:
            bar.close()
    for model in models:
        for batch_size in batch_sizes:
            say(f"{where}: {model}, one step at batch {batch_size} (the builds its shapes "
                f"need)")
            _step(model, bk, batch_size)
    seconds = time.perf_counter() - start
    say(f"{where} ({bk.info()['name']}): ready in {seconds:.1f} s, kernels cached in "
        f"{bk.cache_dir}")
    return len(builds), seconds


def build_text(build):
    """'conv -DSTORED_HALF=1' for a build (family, options, arch)."""
    family, options, arch = build
    return " ".join([family, *options, *([f"({arch})"] if arch else [])])


def _step(model, bk, batch_size):
    from . import models, optim
    rng = np.random.default_rng(0)
    optimizer = None
    if model == "gpt":          # windows of token ids, each token's next one its target
        g = models.GPT_STEP
        x, y = (rng.integers(0, g["vocab"], (batch_size, g["context"])) for _ in range(2))
        net = models.gpt(g["vocab"], g["context"], g["layers"], g["heads"], g["dim"],
                         g["dropout"], device=bk.name, seed=0, precision=bk.precision)
        optimizer = optim.AdamW(1e-3)
    else:
        x = rng.random((batch_size, 1, 28, 28), dtype=np.float32)
        y = rng.integers(0, 10, batch_size)
        net = models.build(model, x.shape[1:], 10, device=bk.name, seed=0,
                           precision=bk.precision)
    try:
        net.fit(x, y, epochs=1, batch_size=batch_size, verbose=0,
                **({"optimizer": optimizer} if optimizer else {}))
        net.evaluate(x, y)
        net.predict(x)
    finally:
        net.free()
