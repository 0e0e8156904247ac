"""write_samples' way up, written once over each runtime's few verbs: a `CopyLane` copies
a batch's part into pinned host memory (split over threads) and from there up on a queue or
stream of its own, beside the backend's, PINNED pinned buffers taken in turn (one is
filled again once its last copy is done), and per half of a staging buffer the event after
which the device has read it. A runtime's lane supplies `_pin` (pinned host memory),
`_wait` (the host waits for an event) and `_copy_up` (an asynchronous copy after an
event, returning its own)."""
import numpy as np

# the pinned buffers a copy lane fills in turn, and what a half of staging holds in place
# of an event when a plain write used it last
PINNED = 3
BEHIND = "behind"

# the threads a lane's host copy into pinned memory is split over: one host thread copies
# 7.5 GB/s on the H100's host, and two took 31 MB from 3.6 to 2.5 ms there; parts below
# SPLIT_BYTES are copied by the calling thread alone
COPY_THREADS = 2
SPLIT_BYTES = 2**20
_copiers = None


def copy_split(dst, src):
    """dst[...] = src (flat arrays of one size), in COPY_THREADS pieces copied at once:
    NumPy lets go of the GIL while it copies a large piece."""
    global _copiers
    if src.nbytes < SPLIT_BYTES or COPY_THREADS < 2:
        np.copyto(dst, src)
        return
    if _copiers is None:
        from concurrent.futures import ThreadPoolExecutor
        _copiers = ThreadPoolExecutor(COPY_THREADS - 1, thread_name_prefix="portanet-copy")
    cuts = [len(src) * i // COPY_THREADS for i in range(COPY_THREADS + 1)]
    pieces = [_copiers.submit(np.copyto, dst[a:b], src[a:b])
              for a, b in zip(cuts[1:-1], cuts[2:])]
    np.copyto(dst[:cuts[1]], src[:cuts[1]])
    for piece in pieces:
        piece.result()


class CopyLane:
    """A copy lane (see the module's docstring); `read[half]` is what the backend's next
    write into that half of staging waits for (BEHIND: made then, after a plain write)."""

    def __init__(self):
        self.pinned, self.copied, self.next = [None] * PINNED, [None] * PINNED, 0
        self.read = [BEHIND, BEHIND]        # no send yet: after all before the first

    def send(self, part, dest, dtype, after):
        """part (a host array) copied to dest (the runtime's: an address, a slot of a
        buffer) as dtype after the event `after` (None: at once); returns the copy's event."""
        i, self.next = self.next, (self.next + 1) % PINNED
        if self.copied[i] is not None:
            self._wait(self.copied[i])
        held = self.pinned[i]
        if held is None or held[1].size < part.size or held[1].dtype != dtype:
            held = self.pinned[i] = self._pin(part, dtype)
        host = held[1][:part.size]
        copy_split(host, part.reshape(-1))
        self.copied[i] = self._copy_up(host, dest, after)
        return self.copied[i]

    def _pin(self, part, dtype):
        """(what keeps it, a host array of part.size dtype elements) in pinned memory."""
        raise NotImplementedError

    def _wait(self, event):
        raise NotImplementedError

    def _copy_up(self, host, dest, after):
        raise NotImplementedError
