"""Memory planned before it is allocated.

Every buffer a network will hold is known from its architecture and the batch size:
parameters, optimizer state, batch buffers and workspaces. The network lists them as
`Buffer`s; the same list is what it allocates, so the plan and the allocations cannot
disagree. A `MemoryPlan` compares the total with the device's free memory, and a network
that will not fit is refused with the numbers before anything is allocated (the lesson
of training on an R9 290X: an out-of-memory error half way through a build helps no one).
"""
from dataclasses import dataclass

import numpy as np

from .errors import OutOfMemoryError


@dataclass(frozen=True)
class Buffer:
    owner: str          # the layer's repr, or "network"
    name: str           # the attribute it lives in ("w", "v", "_z", ...)
    kind: str           # "parameters", "optimizer state", "batch", "workspace"
    shape: tuple
    dtype: np.dtype

    @property
    def nbytes(self):
        return elements(self.shape) * np.dtype(self.dtype).itemsize


class MemoryPlan:
    """The buffers of a network at one batch size, their total, and the device's room.

    `available` is what the device has free for them now (plus what the network already
    holds and would give back first); `max_alloc` the largest single buffer it allows."""

    def __init__(self, buffers, batch_size, device, available, max_alloc=None,
                 distributed=None, precision="fp32"):
        self.buffers = list(buffers)
        self.batch_size = batch_size
        self.device = device
        self.precision = precision          # what the buffers' products round to
        self.available = available
        self.max_alloc = max_alloc
        self.distributed = distributed      # the job's Group where the network trains in one

    @property
    def total(self):
        return sum(b.nbytes for b in self.buffers)

    def by_kind(self):
        kinds = {}
        for b in self.buffers:
            kinds[b.kind] = kinds.get(b.kind, 0) + b.nbytes
        return kinds

    def too_big(self):
        """The buffers larger than one allocation may be (OpenCL's max_mem_alloc_size)."""
        return [b for b in self.buffers if self.max_alloc and b.nbytes > self.max_alloc]

    @property
    def fits(self):
        return self.total <= self.available and not self.too_big()

    def largest(self, n=3):
        return sorted(self.buffers, key=lambda b: -b.nbytes)[:n]

    def __str__(self):
        lines = [f"memory plan on {self.device} ({self.precision}), batch {self.batch_size}:"]
        if self.distributed:
            g = self.distributed
            lines[0] = lines[0][:-1] + f" (this rank's; rank {g.rank} of {g.size} over " \
                f"{g.engine}, devices {', '.join(g.devices)}, each rank's gradients " \
                f"averaged through host memory):"
        for b in self.buffers:
            shape = "x".join(map(str, b.shape))
            lines.append(f"  {b.owner:36.36s} {b.name:18s} {b.kind:16s} {shape:>16s} "
                         f"{type_text(b.dtype, self.precision):>5s} {size_text(b.nbytes):>10s}")
        for kind, nbytes in self.by_kind().items():
            lines.append(f"  {'':36s} {'':18s} {kind:16s} {'':16s} {'':5s} "
                         f"{size_text(nbytes):>10s}")
        lines.append(f"  total {size_text(self.total)} of {size_text(self.available)} available"
                     + ("" if self.fits else "  (does NOT fit)"))
        return "\n".join(lines)


def type_text(dtype, precision):
    """A buffer's element type in a plan: f32, f64, i32, and bf16 or fp16 for 16-bit storage
    (bf16's is held as uint16 bits)."""
    dtype = np.dtype(dtype)
    if dtype == np.uint16 and precision == "bf16":
        return "bf16"
    if dtype == np.float16:
        return "fp16"
    return f"{dtype.kind}{8 * dtype.itemsize}"


def refuse(plan, what, largest_batch=None):
    """The OutOfMemoryError for a plan that does not fit: the numbers, the biggest
    buffers, and what would fit."""
    biggest = ", ".join(f"{b.owner} {b.name} {size_text(b.nbytes)}" for b in plan.largest())
    text = (f"{what} needs {size_text(plan.total)} on {plan.device} but "
            f"{size_text(plan.available)} are available (largest buffers: {biggest})")
    for b in plan.too_big():
        text += (f"; {b.owner} {b.name} ({size_text(b.nbytes)}) exceeds the device's largest "
                 f"single allocation of {size_text(plan.max_alloc)}")
    if largest_batch:
        text += f". The largest batch that fits is {largest_batch}: use batch_size <= {largest_batch}"
    elif largest_batch == 0:
        text += ". Not even one sample fits: use a smaller network or a bigger device"
    else:
        text += ": use a smaller network or a bigger device"
    return OutOfMemoryError(text)


def largest_batch(fits, limit):
    """The largest m in [1, limit] for which fits(m) (false from some m on: plans grow with
    m), or 0."""
    if not fits(1):
        return 0
    low, high = 1, limit
    while low < high:
        mid = (low + high + 1) // 2
        if fits(mid):
            low = mid
        else:
            high = mid - 1
    return low


def allocate(backend, buffers):
    """{name: device array} for `buffers`, all or nothing: on a failure the ones already
    made are given back before the error goes on."""
    made = []
    try:
        for b in buffers:
            made.append(backend.empty(b.shape, b.dtype, label=f"{b.owner} {b.name}"))
    except BaseException:
        for x in made:
            backend.free(x)
        raise
    return made


def elements(shape):
    """prod(shape) in Python ints: NumPy's prod overflows silently for absurd sizes."""
    n = 1
    for d in shape:
        n *= int(d)
    return n


def size_text(nbytes):
    """1.5 MiB, 12 KiB, 100 B."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} B"
