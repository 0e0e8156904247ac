"""Sums over the ranks of an MPI job through host memory that the ranks of a host share
(an MPI-3 shared window), for host staging (distributed._Host).

An MPI on one host sums a large vector through its own copies between the processes: on
an H200 host, Open MPI 4.1's Allreduce of mlp-big's 220 MB ran at 1.3 GB/s whole and
3.3 GB/s in 8 MiB pieces. Here each rank copies its vector once into its slot of memory
every rank of the host maps, each adds up its share of every slot, and each reads the
sum from where it was written: no copy between processes at all. Ranks on several hosts
add one Allreduce of the host's sum among one rank of each host (the leaders).

Every rank reads the same sum, added in rank order, so the ranks stay identical."""
import numpy as np

PAGE = 4096                     # slots start on pages of their own


class Node:
    """A job's ranks grouped by host: `node`, the ranks sharing this one's memory, and
    `leaders`, rank 0 of each host (None on the others, and where all share one host).
    Made once per job: splitting is collective. node: a communicator of ranks that share
    memory, to group them otherwise than by host (default: by host, MPI's
    COMM_TYPE_SHARED)."""

    def __init__(self, channel, node=None):
        MPI, comm = channel.MPI, channel.comm
        self.MPI = MPI
        self.node = comm.Split_type(MPI.COMM_TYPE_SHARED) if node is None else node
        self.hosts = comm.allreduce(1 if self.node.Get_rank() == 0 else 0)
        self.leaders = None
        if self.hosts > 1:
            leaders = comm.Split(0 if self.node.Get_rank() == 0 else MPI.UNDEFINED)
            self.leaders = None if leaders == MPI.COMM_NULL else leaders


class SharedSum:
    """Sums of vectors of up to n elements of dtype over every rank, through one shared
    window of the host: a slot of n per rank, and two result vectors (the steps take
    turns: a rank may still be copying one step's sum up while the others add up the
    next). Making one is collective over the host's ranks. backend: the device whose
    copies go from and to it, which pins it (Backend.host_pin) for copies in the
    background; None for none."""

    def __init__(self, node, n, dtype, backend=None):
        self.node_ = node
        comm, MPI = node.node, node.MPI
        self.dtype = np.dtype(dtype)
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        step = -(-max(n, 1) * self.dtype.itemsize // PAGE) * PAGE // self.dtype.itemsize
        whole = step * (self.size + 2)
        # all of it in rank 0's part of the window, one piece of memory to map and pin
        mine = whole * self.dtype.itemsize if self.rank == 0 else 0
        self.window = MPI.Win.Allocate_shared(mine, self.dtype.itemsize, comm=comm)
        # a passive epoch for the window's life: Sync orders this rank's loads and stores
        # of it against the others' across each barrier (MPI's separate memory model)
        self.window.Lock_all(MPI.MODE_NOCHECK)
        buf, _ = self.window.Shared_query(0)
        memory = np.frombuffer(buf, self.dtype, count=whole)
        self.backend = backend
        if backend is not None:
            memory = backend.host_pin(memory)
        self.memory = memory
        self.slots = [memory[r * step:r * step + n] for r in range(self.size)]
        self.results = [memory[(self.size + t) * step:(self.size + t) * step + n]
                        for t in (0, 1)]
        self.n = n

    @property
    def mine(self):
        """This rank's slot: its vector goes here."""
        return self.slots[self.rank]

    def add(self, start, count, turn):
        """results[turn][start:start + count] <- the sum over every rank of its slot's
        elements there, once every rank of the host has its own in its slot (each rank
        calls it for the same pieces in the same order)."""
        self._barrier()                         # every slot holds the piece
        share = -(-count // self.size)
        lo = start + min(count, self.rank * share)
        hi = start + min(count, (self.rank + 1) * share)
        out = self.results[turn][lo:hi]
        if self.size == 1:
            out[...] = self.slots[0][lo:hi]
        else:
            np.add(self.slots[0][lo:hi], self.slots[1][lo:hi], out=out)
            for slot in self.slots[2:]:
                np.add(out, slot[lo:hi], out=out)
        self._barrier()                         # every share summed: the host's sum
        node = self.node_
        if node.hosts > 1:
            if node.leaders is not None:
                node.leaders.Allreduce(node.MPI.IN_PLACE,
                                       self.results[turn][start:start + count],
                                       op=node.MPI.SUM)
            self._barrier()                     # the job's sum

    def _barrier(self):
        self.window.Sync()
        self.node_.node.Barrier()
        self.window.Sync()

    def close(self):
        """Give the window back (collective over the host's ranks), once no copy from or
        to it is under way."""
        if self.backend is not None:
            self.backend.host_unpin(self.memory)
        self.slots = self.results = self.memory = None
        self.window.Unlock_all()
        self.window.Free()
