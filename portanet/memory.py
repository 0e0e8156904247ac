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

from .errors import OutOfMemoryError, ShapeError


@dataclass(frozen=True)
class Buffer:
    owner: str          # the layer's repr, or "network"
    name: str           # the attribute it lives in ("w", "v", "_z", ...)
    kind: str           # "parameters", "optimizer state", "batch", "workspace"
    shape: tuple
    dtype: np.dtype
    path: str = None    # the owning layer's number in the network ("2.1"), as walk gives it

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
        # [(path, repr, description)] of the network's layers in walk order, which the
        # network gives (Sequential.memory_plan) to number and describe them in __str__
        self.layers = None

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
        """The plan as a table: a row per buffer, grouped by the layer that holds it (its
        number, then its whole description, wrapped), the totals by kind, the total against
        the device's room, and what each column means."""
        head = (f"memory plan on {self.device} ({self.precision}), batch {self.batch_size}: "
                f"every buffer portanet allocates to train on it")
        if self.distributed:
            g = self.distributed
            where = ("where they are, in buckets beside backward" if g.engine == "nccl"
                     else "through host memory, a bucket at a time")
            head += (f" (this rank's; rank {g.rank} of {g.size} over {g.engine}, devices "
                     f"{', '.join(g.devices)}, each rank's gradients averaged {where})")
        lines = wrap(head, "")
        lines.append(f"  {'layer':8s} {'buffer':14s} {'kind':16s} {'elements':>12s} "
                     f"{'type':>5s} {'bytes':>10s}")
        for label, description, buffers in self.groups():
            if description:
                lines += wrap(description, f"  {label:8s} ", " " * 11)
            for b in buffers:
                lines.append(f"  {label:8s} {b.name:14s} {b.kind:16s} "
                             f"{elements(b.shape):>12d} {type_text(b.dtype, self.precision):>5s} "
                             f"{size_text(b.nbytes):>10s}")
        lines += wrap("by kind: " + ", ".join(f"{kind} {size_text(nbytes)}"
                                              for kind, nbytes in self.by_kind().items()), "  ")
        lines.append(f"  total {size_text(self.total)} of {room_text(self.device, self.available)}"
                     + ("" if self.fits else "  (does NOT fit)"))
        for text in COLUMNS + (f"available: {room_meaning(self.device)}",):
            lines += wrap(text, "  ", "      ")
        return "\n".join(lines)

    def groups(self):
        """[(label, description or None, [Buffer])]: the network's own buffers, then each
        layer's (label its number, as Sequential.walk names it, where the network gave
        `layers`; else numbered in the order they come), then the backend's and fit's."""
        own = [b for b in self.buffers if b.owner in SHARED]
        theirs = [b for b in self.buffers if b.owner not in SHARED]
        out = []
        if any(b.owner == "network" for b in own):
            out.append(("network", None, [b for b in own if b.owner == "network"]))
        out += _by_layer(theirs, self.layers)
        for owner in SHARED[1:]:
            if any(b.owner == owner for b in own):
                out.append((owner, None, [b for b in own if b.owner == owner]))
        return out


# owners that are no layer: the network's own buffers, a backend's workspaces, fit's data
SHARED = ("network", "backend", "fit")

COLUMNS = (
    "layer: the layer's number (2.1: layer 1 inside block 2, as in the names of a saved "
    "file's tensors), its description on the line above its buffers; network: the "
    "network's own buffers, which its layers share; backend: the device's workspaces "
    "(copies of a product's inputs); fit: the training set kept on the device.",
    "buffer: flat = all of the layer's parameters in one vector (weights, then biases); "
    "v, m, buf, gavg: the optimizer's state, one value per parameter; running_mean, "
    "running_var: BatchNorm's statistics; names starting with _ hold a batch's values "
    "(_x the inputs, _y the targets, _z and _a a layer's sums and activations: one "
    "buffer, _z, where the backward does not need the sums, _a for BatchNorm) or scratch "
    "space (_workspace, _ones, _staging).",
    "kind: parameters (kept and saved), optimizer state (kept while training), batch "
    "(grows with the batch size), workspace (scratch reused by every step), dataset "
    "(fit's data on the device).",
    "elements, type (f32 float32, i32 int32, bf16 and fp16 16-bit storage) and bytes of "
    "each buffer.",
)

WIDTH = 100             # the widest a plan's or a summary's line grows before it wraps


def wrap(text, first, rest=None, width=WIDTH):
    """text as lines of at most `width` characters, the first after `first`, the others
    after `rest` (default: as much space as `first`); words (and a description's
    arguments, after their commas) are never cut."""
    import textwrap
    rest = " " * len(first) if rest is None else rest
    return textwrap.wrap(text, width, initial_indent=first, subsequent_indent=rest,
                         break_long_words=False, break_on_hyphens=False) or [first.rstrip()]


def _by_layer(buffers, layers):
    """Buffers of layers grouped by layer: [(number, description, [Buffer])]. With the
    network's `layers`, [(path, repr, description)] in walk order, each buffer goes to the
    layer its path names; without, or for a buffer of no known path, owners are numbered
    as they come."""
    index = {path: i for i, (path, _, _) in enumerate(layers or ())}
    groups = [(path, description, []) for path, _, description in layers or ()]
    strays = {}                 # owner -> its group, for buffers of no known path
    for b in buffers:
        i = index.get(b.path)
        if i is None:
            i = strays.get(b.owner)
            if i is None:
                i = strays[b.owner] = len(groups)
                groups.append((str(i), b.owner, []))
        groups[i][2].append(b)
    return [group for group in groups if group[2]]


# what a plan's room on the device is: the same figure, said the same way, in a plan, a
# summary and a refusal
ROOM = {
    "cpu": "the host memory that can be allocated without swapping, Linux's MemAvailable",
    "opencl": "the device's memory less what portanet has allocated on it (OpenCL cannot "
              "say what other programs use)",
    "cuda": "the device's free memory as the driver reports it (other programs' use "
            "counted)",
}


def room_meaning(device):
    """What the room of a plan on `device` ("cpu", "opencl:0:0", "cuda:1") is."""
    kind = str(device).split(":")[0]
    return ROOM.get(kind, "the device's free memory") + \
        ", plus what this network already holds there"


def room_text(device, available):
    """'22.6 GiB available on cpu': a plan's room, as a plan, a summary and a refusal say
    it."""
    return f"{size_text(available)} available on {device}"


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
    biggest = ", ".join(f"{_short(b.owner)} {b.name} {size_text(b.nbytes)}"
                        for b in plan.largest())
    text = (f"{what} needs {size_text(plan.total)}, more than the "
            f"{room_text(plan.device, plan.available)} ({room_meaning(plan.device)}; "
            f"largest buffers: {biggest})")
    for b in plan.too_big():
        text += (f"; {_short(b.owner)} {b.name} ({size_text(b.nbytes)}) exceeds the device's largest "
                 f"single allocation of {size_text(plan.max_alloc)}")
    if largest_batch:
        text += (f". The largest batch that fits is {largest_batch}: use batch_size <= "
                 f"{largest_batch}")
    elif largest_batch == 0:
        text += ". Not even one sample fits: use a smaller network or a bigger device"
    else:
        text += ": use a smaller network or a bigger device"
    return OutOfMemoryError(text, largest_batch or None)


def _short(owner, most=80):
    """A buffer's owner in one line of a message: a block's description of its whole
    inside (thousands of characters for a ResNet's) as its kind, Residual(...)."""
    return owner if len(owner) <= most else owner.split("(")[0] + "(...)"


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


MAX_ELEMENTS = 2**31 - 1      # the kernels index an array with 32-bit ints


def allocate(backend, buffers):
    """{name: device array} for `buffers`, all or nothing: on a failure the ones already
    made are given back before the error goes on. A buffer of more than MAX_ELEMENTS is
    refused before anything is made, naming it."""
    for b in buffers:
        if elements(b.shape) > MAX_ELEMENTS:
            raise ShapeError(f"{b.owner} {b.name} would hold {elements(b.shape):,d} elements; "
                             f"portanet's kernels index at most {MAX_ELEMENTS:,d}: use a "
                             f"smaller batch (or layer)")
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
