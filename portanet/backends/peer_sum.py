"""Sums of small buckets over the CUDA ranks of one host, each rank reading the others'
memory (CUDA IPC: over NVLink where the GPUs have it). distributed.py's NCCL engine sends a
bucket of at most PEER_BYTES this way, where an NCCL all-reduce costs its protocol's
latency more than its bytes: on two H200s an all-reduce of LeNet's 200 KB gradient took
13.4 us in a CUDA graph through NCCL, 8.7 us as a one-shot sum of peer reads
(bench/allreduce_latency.py, PyTorch's symmetric memory). The kernel is kernels_cu/peer.cu:
one launch on the engine's stream, copy in, flags, sum, recorded with the step like NCCL's
calls.

Every rank keeps a staging buffer of two halves of PEER_BYTES, a flag per rank and block
and a count per block, 2 MiB and a few hundred bytes of device memory outside the network's
plan, made once when the job's engine starts. Jobs over several hosts, of more than
MAX_RANKS ranks, or where a rank cannot map the others' memory, send every bucket through
NCCL (every rank decides alike, from what all of them report)."""
import logging
import socket

import numpy as np

log = logging.getLogger("portanet")

PEER_BYTES = 1 << 20        # the largest bucket summed by peer reads: chosen, not measured
#                             beyond LeNet's 200 KB (bench/allreduce_latency.py can)
MAX_RANKS = 2               # what it is tested and measured on; the kernel takes up to THREADS
BLOCKS, THREADS = 32, 256   # the kernel's grid, the same on every rank (each block a slice)
_CODES = {np.dtype(np.float32): "f", np.dtype(np.float64): "d"}


def make(group, backend):
    """The job's PeerSum on this rank, or None where the job cannot sum by peer reads
    (collective: every rank calls it and every rank gets the same answer; why not, in the
    debug log)."""
    import pycuda.driver as drv
    peer = None
    if group.size <= MAX_RANKS:
        try:
            peer = PeerSum(group, backend, drv)
        except Exception as e:          # no IPC here: this rank says so below
            log.debug("rank %d: no memory to share with its peers (%s)", group.rank, e)
    everyone = group.channel.allgather(
        (socket.gethostname(), peer.handles if peer is not None else None))
    if peer is None or len({host for host, _ in everyone}) > 1 \
            or any(handles is None for _, handles in everyone):
        return None
    try:
        peer.open([handles for _, handles in everyone])
        ok = True
    except Exception as e:              # another rank's memory cannot be mapped here
        log.debug("rank %d cannot map its peers' memory (%s)", group.rank, e)
        ok = False
    return peer if all(group.channel.allgather(ok)) else None


class PeerSum:
    """This rank's staging buffer, flags and counts, the others' mapped (`open`), and the
    kernel that sums a bucket (`sum`)."""

    def __init__(self, group, backend, drv):
        self.drv, self.rank, self.ranks = drv, group.rank, group.size
        self.dtype = np.dtype(backend.dtype)
        self.half = PEER_BYTES // self.dtype.itemsize
        with backend._lock:
            self.staging = drv.mem_alloc(2 * PEER_BYTES)
            self.flags = drv.mem_alloc(4 * self.ranks * BLOCKS)
            self.counts = drv.mem_alloc(4 * BLOCKS)
            drv.memset_d32(self.flags, 0, self.ranks * BLOCKS)
            drv.memset_d32(self.counts, 0, BLOCKS)
            self.handles = (drv.mem_get_ipc_handle(self.staging),
                            drv.mem_get_ipc_handle(self.flags))
        self.backend, self.mapped, self.table, self.kernel = backend, [], None, None

    def open(self, handles):
        """Map every other rank's staging buffer and flags (`handles`, every rank's in rank
        order) and write the table of addresses the kernel reads."""
        drv, bk = self.drv, self.backend
        with bk._lock:
            addresses = [[], []]
            for r, pair in enumerate(handles):
                for which, (own, handle) in enumerate(zip((self.staging, self.flags), pair)):
                    if r == self.rank:
                        addresses[which].append(int(own))
                    else:
                        mapped = drv.IPCMemoryHandle(handle)
                        self.mapped.append(mapped)
                        addresses[which].append(int(mapped))
            table = np.array(addresses[0] + addresses[1], np.uint64)
            self.table = drv.mem_alloc(table.nbytes)
            drv.memcpy_htod(self.table, table)
            self.kernel = bk._build("peer", "peer_sum")
            code = _CODES[self.dtype]
            self.kernel.prepare(f"Pi{code}PPiii")

    def takes(self, arrays):
        """Whether a bucket of `arrays` is summed here: of the backend's type, PEER_BYTES
        at most in all."""
        return all(np.dtype(x.dtype) == self.dtype for x in arrays) \
            and sum(x.size for x in arrays) * self.dtype.itemsize <= PEER_BYTES

    def sum(self, x, weight, stream):
        """x <- sum over the ranks of weight_r x_r, on `stream` (x a DeviceArray of at most
        PEER_BYTES; the caller holds the backend's lock)."""
        address = int(x.buf) + x.offset * self.dtype.itemsize
        self.kernel.prepared_async_call(
            (BLOCKS, 1), (THREADS, 1, 1), stream, np.uintp(address), np.int32(x.size),
            self.dtype.type(weight), np.uintp(int(self.table)), np.uintp(int(self.counts)),
            np.int32(self.rank), np.int32(self.ranks), np.int32(self.half))
