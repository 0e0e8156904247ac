"""Data-parallel training over ranks (processes), each on a device of its own.

All ranks hold the same weights and optimizer state before a step. fit splits each
shuffled global batch of `ranks x batch_size` samples so that rank r trains on the r-th
share, and the layers' gradient targets are averaged across ranks before the optimizer's
updates (training.OptimizerState: `Group.averaging`). With SGD the target is the velocity
itself: every rank computes v_r = mu v - eta / m_r g_r from its m_r samples, and
sum_r (m_r / M) v_r = mu v - eta / M sum_r g_r, the full batch's step. Adam and RMSprop
average their gradient workspace alike (the whole network's in a job). Weighting by
m_r / M keeps the step exact for uneven shares (the last batch of an epoch, `balance`). So
every rank's weights stay identical and equal, to rounding, a one-process run over the
same global batches.

The targets are averaged in buckets, as PyTorch's DDP does: backward writes them from the
last layer to the first, and each time the targets written since the last all-reduce add
up to a bucket (FIRST_BUCKET_BYTES, then BUCKET_BYTES), they go as one all-reduce while
backward goes on with the layers below; the updates wait for the last one.

Engines (PORTANET_DIST, or init's engine):

- nccl: NCCL (nccl4py) between CUDA devices, on device memory: each bucket one grouped
  all-reduce on a stream beside the backend's, started after backward wrote it and joined
  before the updates, inside the recorded step (CUDA graphs capture NCCL's calls), with
  each rank's weight applied by NCCL (a PreMulSum reduction); on one host, a bucket of at
  most peer_sum.PEER_BYTES is summed by the ranks reading each other's memory instead
  (one kernel on that stream: NCCL's latency is most of a small bucket's all-reduce);
- mpi: MPI (mpi4py) for any mix of backends, each bucket staged through host memory;
- tcp: the same host staging over portanet's own rendezvous (launch.TcpChannel), for cpu
  and mixed jobs started without MPI;
- auto (the default): nccl where every rank is a CUDA device and nccl4py is here, else
  the host staging of the job's channel (mpi or tcp).

Launching: torchrun, srun or mpiexec start the ranks; launch.py reads who each is and
gives the host channel (MPI, or portanet's rendezvous at MASTER_ADDR where the launcher
gave it: an all-CUDA job then needs no MPI). PORTANET_DEVICE may name one device per local
rank: "cuda:{local_rank}" or a comma list ("cuda:0,opencl:0:0": local rank i takes the
i-th). init() sets this process's PORTANET_DEVICE to its own, so every network built
afterwards without a device is there.
"""
import contextlib

import numpy as np

from . import config, launch
from .backends import peer_sum
from .errors import InputError

ENGINES = ("auto", "nccl", "mpi", "tcp")
FIRST_BUCKET_BYTES = 1 << 20    # DDP's first bucket: the first all-reduce starts early
# the first bucket where peer reads sum the small ones (a few us a sum): LeNet's dense
# gradient goes alone, overlapped with the convolutions' backward (docs/distributed.md)
PEER_FIRST_BUCKET_BYTES = 1 << 17
BUCKET_BYTES = 25 << 20         # DDP's bucket_cap_mb: few launches, yet overlap with backward
CHUNK_BYTES = 8 << 20           # host staging's piece: its copies and sum overlap the next's

_group = None


def init(engine=None, balance=None, bucket_mb=BUCKET_BYTES / 2**20, first_bucket_mb=None):
    """Join the job the launcher started; returns its Group (rank, size, local rank,
    device, engine). engine: one of ENGINES (PORTANET_DIST sets it; "auto" by default).
    balance: this rank's relative step rate, to give it that share of each global batch
    (None: equal shares). bucket_mb, first_bucket_mb: the size at which the gradients
    written since the last all-reduce go as one (Buckets; DDP's bucket_cap_mb and first
    bucket), the same on every rank; first_bucket_mb None: the engine's (`first_bucket`).
    Calling it again returns the group already joined."""
    global _group
    if _group is not None:
        return _group
    engine = (engine or config.dist_engine()).strip().lower()
    if engine not in ENGINES:
        raise InputError(f"PORTANET_DIST / engine {engine!r} is not an engine portanet has: "
                         f"{', '.join(ENGINES)}")
    rate = _rate(1.0 if balance is None else balance)
    buckets = tuple(value if value is None else _megabytes(name, value) for name, value in (
        ("first_bucket_mb", first_bucket_mb), ("bucket_mb", bucket_mb)))
    channel, local = launch.channel(use_mpi=engine == "mpi")
    if local is None:
        local = channel.local_rank()
    if local is None:           # a rendezvous without LOCAL_RANK: one machine
        local = channel.rank
    device = device_for(local, config.device_variable())
    if device is not None:
        config.set_device_variable(device)
    everyone = channel.allgather((rate, device or "cpu", _has_nccl(), buckets))
    rates, devices = [e[0] for e in everyone], [e[1] for e in everyone]
    if any(e[3] != everyone[0][3] for e in everyone):
        raise InputError(f"the ranks give different bucket sizes {[e[3] for e in everyone]} "
                         f"(bytes: first, then each): give every rank the same, or none")
    engine = _engine(engine, channel, devices, all(e[2] for e in everyone))
    group = Group(channel, channel.rank, channel.size, local, devices, engine, rates)
    group.engine_ = _Nccl(group) if engine == "nccl" else _Host(group)
    if buckets[0] is None:          # every rank's engine decides alike
        buckets = (first_bucket(group.engine_), buckets[1])
    group.bucket_bytes = buckets
    _group = group
    return _group


def first_bucket(engine):
    """A step's first bucket in bytes where init is not given one: PEER_FIRST_BUCKET_BYTES
    where `engine` sums the small buckets by peer reads, else DDP's FIRST_BUCKET_BYTES."""
    return (PEER_FIRST_BUCKET_BYTES if getattr(engine, "peer", None) is not None
            else FIRST_BUCKET_BYTES)


def _engine(asked, channel, devices, nccl_everywhere):
    cuda = all(d.startswith("cuda") for d in devices)
    if asked == "auto":
        return "nccl" if cuda and nccl_everywhere else channel.kind
    if asked == "tcp" and channel.kind != "tcp":
        raise InputError("PORTANET_DIST=tcp needs portanet's rendezvous: launch with torchrun, "
                         "or set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT")
    if asked == "nccl" and not cuda:
        raise InputError(f"PORTANET_DIST=nccl takes CUDA devices only; this job's are "
                         f"{', '.join(devices)}: leave PORTANET_DIST unset (auto: host "
                         f"staging over the launcher's channel) for a job of other devices")
    if asked == "nccl" and not nccl_everywhere:
        raise InputError("PORTANET_DIST=nccl needs nccl4py and NCCL on every rank: pip "
                         "install 'portanet[nccl]'")
    return asked


def _has_nccl():
    import importlib
    try:
        importlib.import_module("nccl.core")    # imported whole: a broken install is not NCCL
    except Exception:
        return False
    return True


def current():
    """The Group this process has joined, or None."""
    return _group


def leader():
    """Whether this process prints, evaluates and saves: rank 0, or not distributed."""
    return _group is None or _group.rank == 0


@contextlib.contextmanager
def paused():
    """Train alone within the block (the group kept for after it): what one rank's step
    costs without the averaging, as `portanet bench --distributed` compares."""
    global _group
    group, _group = _group, None
    try:
        yield
    finally:
        _group = group


def shutdown():
    """Leave the group (fit trains alone again) and its channel (portanet's rendezvous
    closes its lines; MPI itself ends with the process)."""
    global _group
    if _group is not None:
        _group.channel.close()
    _group = None


def device_for(local_rank, spec):
    """This local rank's device string from PORTANET_DEVICE's: formatted with
    {local_rank}, or the local_rank-th of a comma list; None where it is unset."""
    if spec is None or not spec.strip():
        return None
    try:
        spec = spec.format(local_rank=local_rank)
    except (KeyError, IndexError, ValueError) as e:
        raise InputError(f"PORTANET_DEVICE={spec!r}: {{local_rank}} is the only field it may "
                         f"name ({e})") from e
    choices = [s.strip() for s in spec.split(",")]
    if len(choices) == 1:
        return choices[0]
    if local_rank >= len(choices):
        raise InputError(f"PORTANET_DEVICE={spec!r} names {len(choices)} devices, for local "
                         f"ranks 0 to {len(choices) - 1}; local rank {local_rank} has none: "
                         f"name one per rank this machine runs")
    return choices[local_rank]


class Group:
    """The job's ranks as this process sees them. shares(batch_size): each rank's samples
    of a global batch; averaging(backend): a step's bucketed averaging (Buckets);
    average(backend, x, weight): x <- sum over ranks of weight_r x_r, at once."""

    def __init__(self, channel, rank, size, local_rank, devices, engine, rates):
        self.channel, self.rank, self.size, self.local_rank = channel, rank, size, local_rank
        self.devices, self.engine, self.rates = devices, engine, rates
        self.averages = 0                   # all-reduces so far (the bench counts them)
        self.bucket_bytes = (FIRST_BUCKET_BYTES, BUCKET_BYTES)      # (first, each after)
        self.engine_ = None                 # _Nccl or _Host: reduce(bk, targets, w), join

    @property
    def records(self):
        """Whether a step with its averaging can be recorded and replayed: NCCL's calls
        are device work on a stream; host staging is not (and one rank averages nothing)."""
        return self.engine == "nccl" or self.size == 1

    def balance(self, rate):
        """Shares of each global batch in proportion to each rank's step rate (samples a
        second, as step_rate measures); every rank gives its own."""
        self.rates = self.channel.allgather(_rate(rate))

    @property
    def device(self):
        return self.devices[self.rank]

    def shares(self, n):
        """Each rank's part of n samples: proportional to its rate (equal by default),
        whole numbers that add up to n, the remainders to the largest fractions first."""
        exact = np.asarray(self.rates, np.float64) * n / sum(self.rates)
        out = np.floor(exact).astype(np.int64)
        for r in np.argsort(-(exact - out), kind="stable")[:n - int(out.sum())]:
            out[r] += 1
        return [int(k) for k in out]

    def part(self, indices, shares):
        """(this rank's indices of a global batch, split as `shares` says, and its weight
        m_r / M)."""
        start = sum(shares[:self.rank])
        mine = indices[start:start + shares[self.rank]]
        return mine, len(mine) / len(indices)

    def averaging(self, backend):
        """The bucketed averaging of a step's gradient targets on backend (Buckets)."""
        return Buckets(self, backend)

    def average(self, backend, x, weight):
        """x <- sum_r weight_r x_r over the ranks, in place, before the backend's next
        work (BatchNorm's running statistics at an epoch's end)."""
        if self.size > 1:
            self.averages += 1
            self.engine_.reduce(backend, [x], weight)
            self.engine_.join(backend)

    def broadcast(self, backend, x):
        """x <- rank 0's x, in place."""
        _on_host(backend, x, self.channel.broadcast)

    def broadcast_state(self, net):
        """Rank 0's parameters, saved buffers and optimizer state on every rank."""
        arrays = [x for _, layer in net.walk() for x in layer.params().values()]
        if net.optimizer_state is not None:
            arrays += list(net.optimizer_state.tensors().values())
        for x in arrays:
            self.broadcast(net.backend, x)

    def agree(self, settings):
        """An InputError naming what differs where this rank's settings (of fit) are not
        rank 0's: different data or batches would hang a job or train it wrong."""
        theirs = self.channel.bcast(settings)
        differ = [f"{k}: {settings.get(k)!r} here, {v!r} on rank 0" for k, v in theirs.items()
                  if settings.get(k) != v]
        if differ:
            raise InputError(f"rank {self.rank} is not training what rank 0 is ("
                             f"{'; '.join(differ)}): give every rank the same data, network "
                             f"and fit arguments")

    def sum(self, values):
        """The sum over ranks of a few numbers (float64)."""
        values = np.array(values, np.float64)
        self.channel.sum(values)
        return values

    def gather(self, obj):
        """[every rank's obj] on rank 0, None elsewhere."""
        return self.channel.gather(obj)

    def describe(self):
        return {"ranks": self.size, "engine": self.engine, "devices": self.devices,
                "rates": self.rates, "launch": self.channel.kind,
                "bucket_bytes": list(self.bucket_bytes),
                "peer_sum": getattr(self.engine_, "peer", None) is not None}

    def __repr__(self):
        return (f"Group(rank {self.rank} of {self.size}, local {self.local_rank}, "
                f"{self.device}, {self.engine})")


class Buckets:
    """A step's averaging, as backward writes the targets: `add(target, weight)` after a
    layer's backward wrote its target (in Layer.backward_order: every rank adds the same
    targets in the same order, so the ranks' all-reduces pair up), `end(weight)` before
    the updates read them. A bucket goes as one all-reduce when the targets added since
    the last one reach Group.bucket_bytes (the step's first, then each after); end sends
    the rest and waits for them all. A dry run (backends/foresight.py) sends nothing."""

    def __init__(self, group, backend):
        self.group, self.backend, self.engine = group, backend, group.engine_
        self.pending, self.bytes, self.sent = [], 0, 0

    def add(self, target, weight):
        if self.group.size == 1 or getattr(self.backend, "dry", False):
            return
        self.pending.append(target)
        self.bytes += target.size * np.dtype(target.dtype).itemsize
        if self.bytes >= self.group.bucket_bytes[1 if self.sent else 0]:
            self._send(weight)

    def end(self, weight):
        if self.group.size == 1 or getattr(self.backend, "dry", False):
            return
        self._send(weight)
        if self.sent:
            self.engine.join(self.backend)
        self.sent = 0

    def _send(self, weight):
        if self.pending:
            self.engine.reduce(self.backend, self.pending, weight)
            self.group.averages += 1
            self.sent += 1
        self.pending, self.bytes = [], 0


class _Host:
    """Host staging over the job's channel (MPI or portanet's rendezvous), for any mix of
    backends. A bucket's targets are scaled by the weight there and copied down, in
    pieces of CHUNK_BYTES, into host memory kept for that bucket (`fetch`, in order after
    backward wrote them); a worker thread then, piece by piece, waits for the copy, sums it
    over the ranks and copies the sum back up (in the backend's order: before the
    updates, which `join` lets go only once the worker is done). So the copies down, the
    sums and the copies up of a bucket overlap one another and the backward of the layers
    below. The worker is the only thread calling the channel while a step averages.

    Under MPI the host memory is shared by the ranks of a host (shared_sum.SharedSum:
    each rank adds up its share of every rank's piece, with no copy between processes);
    over portanet's rendezvous it is each rank's own pinned memory, summed by the
    channel. On the NumPy reference the pieces are the targets' own memory."""

    def __init__(self, group):
        self.channel = group.channel
        self.node = None                # shared_sum.Node, made with the first window
        self.held = {}                  # (bucket of the step, dtype) -> host vector or SharedSum
        self.sent = 0                   # buckets of this step so far
        self.turn = 0                   # which of SharedSum's results this step sums into
        self.jobs = self.worker = None
        self.failed = None

    def reduce(self, backend, targets, weight):
        dtype = np.dtype(targets[0].dtype)
        step = CHUNK_BYTES // dtype.itemsize
        # the same pieces on every backend: each is one sum, which the ranks' must pair
        pieces = [(x, start, min(step, x.size - start))
                  for x in targets for start in range(0, x.size, step)]
        n = sum(count for _, _, count in pieces)
        key = self.sent, dtype
        shared = self._held(backend, key, n)
        self.sent += 1
        cpu = backend.kind == "cpu"
        at, work = 0, []
        for x in targets:
            if cpu:
                x *= x.dtype.type(weight)
            else:
                backend.scal(weight, x)
        for x, start, count in pieces:
            if cpu:
                view = x.reshape(-1)[start:start + count]
                out = view if shared is None else shared.mine[at:at + count]
                if shared is not None:
                    out[...] = view
                work.append((view, at, out, None))
            else:
                view = backend.view(x, (count,), start)
                out = (shared.mine if shared is not None else self.held[key])[at:at + count]
                work.append((view, at, out, backend.fetch(view, out)))
            at += count
        if cpu or not self.channel.threads:     # an MPI without threads: here, at once
            self._run(backend, work, shared)
            return
        self._start()
        self.jobs.put((backend, work, shared))

    def join(self, backend):
        if self.jobs is not None:
            self.jobs.join()
        self.sent = 0
        self.turn ^= 1
        if self.failed is not None:
            failed, self.failed = self.failed, None
            raise failed

    def _held(self, backend, key, n):
        """The SharedSum for this bucket under MPI, else None (its pinned vector made in
        self.held). A new window is made while the worker is idle: making it is collective,
        and the worker may be in the channel (the first step only)."""
        held = self.held.get(key)
        mpi = self.channel.kind == "mpi"
        size = None if held is None else (held.n if mpi else held.size)
        if size is not None and size >= n:
            return held if mpi else None
        if not mpi:
            if backend.kind != "cpu":
                self.held[key] = backend.host_empty((n,), key[1])
            return None
        from . import shared_sum
        if self.jobs is not None:
            self.jobs.join()
        if self.failed is not None:     # the others wait in its sums: end the job (collective)
            failed, self.failed = self.failed, None
            raise failed
        if held is not None:            # once no copy of either turn is under way
            backend.synchronize()
            held.close()
        if self.node is None:
            self.node = shared_sum.Node(self.channel)
        held = self.held[key] = shared_sum.SharedSum(
            self.node, n, key[1], None if backend.kind == "cpu" else backend)
        return held

    def _start(self):
        if self.worker is None:
            import queue
            import threading
            self.jobs = queue.Queue()
            self.worker = threading.Thread(target=self._work, daemon=True,
                                           name="portanet-averaging")
            self.worker.start()

    def _work(self):
        while True:
            backend, work, shared = self.jobs.get()
            try:
                if self.failed is None:
                    self._run(backend, work, shared)
            except BaseException as e:      # given to the step's thread at join
                self.failed = e
            finally:
                self.jobs.task_done()

    def _run(self, backend, work, shared):
        cpu = backend.kind == "cpu"
        for view, at, out, ticket in work:
            if ticket is not None:
                backend.landed(ticket)
            if shared is None:
                self.channel.sum(out)
                total = out
            else:
                shared.add(at, out.size, self.turn)
                total = shared.results[self.turn][at:at + out.size]
            if cpu:
                if total is not view:
                    view[...] = total
            else:       # total stays as it is until the step after next (SharedSum's turns)
                backend.write(view, total, wait=False)


def step_rate(net, x, y, optimizer, steps=5):
    """Samples a second that `net` trains at on batches like x, y (the rate --balance
    shares the global batch by): two steps to build and record, then `steps` timed. It
    trains net: give it a probe, not the network to train. Measured alone (paused): in the
    job every step would wait for the slowest rank."""
    import time
    with paused():
        for _ in range(2):
            net.train_batch(x, y, optimizer)
        net.backend.synchronize()
        start = time.perf_counter()
        for _ in range(steps):
            net.train_batch(x, y, optimizer)
        net.backend.synchronize()
        return steps * len(x) / (time.perf_counter() - start)


@contextlib.contextmanager
def collective():
    """Within the block, an error on one rank of a job of several ends the job, after the
    error is printed (the channel's abort: MPI's Abort, or leaving the rendezvous without a
    goodbye): the other ranks would wait for it in their next average for ever."""
    try:
        yield
    except BaseException as e:
        group = _group
        if group is None or group.size == 1:
            raise
        import os
        import sys
        import time
        import traceback
        # The error first and the whole text in one write: Abort ends the launcher's
        # forwarding of stderr, and a traceback printed line by line was cut after a line.
        text = (f"portanet: rank {group.rank} of {group.size} failed "
                f"({type(e).__name__}: {e}); ending the job\n"
                + "".join(traceback.format_exception(e)))
        sys.stderr.flush()
        os.write(sys.stderr.fileno(), text.encode(errors="replace"))
        time.sleep(0.5)                 # time for the launcher to forward it
        group.channel.abort(1)
        raise


class _Nccl:
    """The NCCL engine (nccl4py): every rank a CUDA device, the targets averaged where they
    are, with no host copy and no wait. A bucket is one group of in-place all-reduces (one
    NCCL launch) of DLPack views of its targets, on a stream of its own that takes over
    from the backend's stream where backward wrote them (hand_over: an event, in a
    recorded step an edge of the graph), so backward goes on with the layers below; join
    hands back before the updates. The reduction is NCCL's PreMulSum with this rank's
    weight: x <- sum_r w_r x_r in one pass, w_r baked into a recorded step (its key holds
    the share). The channel passes NCCL's unique id. Written against nccl4py 0.6; its
    scaling: bench/gpu_distributed.sh, docs/benchmarks-multi-gpu.md."""

    def __init__(self, group):
        try:
            import nccl.core as nccl
        except ImportError as e:
            raise InputError("PORTANET_DIST=nccl needs nccl4py and NCCL: pip install "
                             "'portanet[nccl]'") from e
        from . import backends
        backend = backends.device()
        if backend.kind != "cuda":
            raise InputError(f"PORTANET_DIST=nccl takes CUDA devices only; rank {group.rank} "
                             f"is on {backend.name}: leave PORTANET_DIST unset (auto) for a "
                             f"job of other devices")
        self.nccl = nccl
        # bytes(UniqueId): nccl4py's documented form (as_bytes is a property there)
        uid = group.channel.bcast(bytes(nccl.get_unique_id()) if group.rank == 0 else None)
        with backend._lock:                 # the backend's context current
            self.comm = nccl.Communicator.init(group.size, group.rank,
                                               nccl.UniqueId.from_bytes(uid))
            self.stream, self.event = backend.runtime.lane()
        self.types = {np.dtype(np.float32): nccl.FLOAT32, np.dtype(np.float64): nccl.FLOAT64}
        self.ops = {}                       # (weight, dtype) -> PreMulSum reduction
        self.peer = peer_sum.make(group, backend)   # small buckets: by peer reads

    def reduce(self, backend, targets, weight):
        rt, nccl = backend.runtime, self.nccl
        spans = _spans(targets)
        with backend._lock:
            rt.hand_over(backend.stream, self.stream, self.event)
            if self.peer is not None and self.peer.takes(spans):
                for x in spans:
                    self.peer.sum(x, weight, self.stream)
                return
            nccl.group_start()
            try:
                for x in spans:
                    view = backend.dlpack_view(x)
                    self.comm.allreduce(view, view, self._op(weight, x.dtype),
                                        stream=int(self.stream.handle))
            finally:
                nccl.group_end()

    def join(self, backend):
        with backend._lock:
            backend.runtime.hand_over(self.stream, backend.stream, self.event)

    def _op(self, weight, dtype):
        key = (float(weight), np.dtype(dtype))
        if key not in self.ops:     # a few: the full batch's share and the last batch's
            self.ops[key] = self.comm.create_pre_mul_sum(float(weight), self.types[key[1]])
        return self.ops[key]


def _spans(targets):
    """The device arrays `targets` as fewer that cover the same elements: neighbours in the
    list that are neighbours in one buffer (a joined state slot's layers, the whole
    gradient workspace's, in backward's order or forward's) become one view. The order
    stays the targets' own, which every rank shares: the ranks' all-reduces must pair."""
    from .backends.arrays import DeviceArray
    out = []
    for x in targets:
        last = out[-1] if out else None
        if last is not None and last.buf is x.buf and last.dtype == x.dtype:
            if last.offset + last.size == x.offset:
                lo = last.offset
            elif x.offset + x.size == last.offset:
                lo = x.offset
            else:
                lo = None
            if lo is not None:
                owner = last.base if last.base is not None else last
                out[-1] = DeviceArray(x.buf, lo, (last.size + x.size,), x.dtype, owner)
                continue
        out.append(x)
    return out


def _on_host(backend, x, work):
    """work(host array of x), in place: x itself on cpu, else a copy written back."""
    host = x if isinstance(x, np.ndarray) else backend.download(x)
    work(host)
    if host is not x:
        backend.write(x, host)


def _megabytes(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 \
            or value != value or value == float("inf"):
        raise InputError(f"{name} must be a number of megabytes >= 0 (0: every layer's "
                         f"gradient goes alone), got {value!r}")
    return int(value * 2**20)


def _rate(rate):
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate > 0:
        raise InputError(f"a rank's step rate (balance) must be a positive number, got "
                         f"{rate!r}")
    return float(rate)
