"""The part of pycuda.driver that portanet's CUDA backend uses, over host memory."""
import bisect
import ctypes
import types

import numpy as np


class Error(Exception):
    pass


class MemoryError(Error):           # noqa: A001 - pycuda's name
    pass


class CompileError(Error):
    pass


class LogicError(Error):
    pass


device_attribute = types.SimpleNamespace(MAX_THREADS_PER_BLOCK="max_threads",
                                         MAX_SHARED_MEMORY_PER_BLOCK="shared",
                                         MULTIPROCESSOR_COUNT="units")
function_attribute = types.SimpleNamespace(MAX_DYNAMIC_SHARED_SIZE_BYTES="dynamic_shared")
ATTRIBUTES = {"max_threads": 1024, "shared": 48 * 1024, "units": 132}
TOTAL = 80 * 2**30
COMPUTE_CAPABILITY = (9, 0)


class Memory:
    """Live allocations by address: every pointer a kernel or a copy is given must lie in
    one of them."""
    starts, blocks = [], {}

    @classmethod
    def check(cls, address, nbytes, what):
        i = bisect.bisect_right(cls.starts, address) - 1
        if i < 0:
            raise LogicError(f"{what}: address {address:#x} is in no allocation")
        start = cls.starts[i]
        block = cls.blocks[start]
        if address + nbytes > start + block.nbytes:
            raise LogicError(f"{what}: {nbytes} bytes at {address:#x} run past the "
                             f"allocation of {block.nbytes} at {start:#x}")


class DeviceAllocation:
    def __init__(self, nbytes):
        self._host = np.zeros(nbytes + 256, np.uint8)
        self.nbytes = nbytes
        self.address = self._host.ctypes.data
        bisect.insort(Memory.starts, self.address)
        Memory.blocks[self.address] = self

    def __int__(self):
        return self.address

    __index__ = __int__

    def free(self):
        if self.address in Memory.blocks:
            Memory.starts.remove(self.address)
            del Memory.blocks[self.address]


def mem_alloc(nbytes):
    if nbytes <= 0:
        raise LogicError("mem_alloc of no bytes")
    if nbytes > TOTAL:
        raise MemoryError("out of memory")
    return DeviceAllocation(int(nbytes))


def mem_get_info():
    used = sum(b.nbytes for b in Memory.blocks.values())
    return TOTAL - used, TOTAL


def _copy(dst, src, nbytes):
    ctypes.memmove(dst, src, nbytes)


def memcpy_htod_async(dst, host, stream=None):
    host = np.ascontiguousarray(host)
    Memory.check(int(dst), host.nbytes, "memcpy_htod")
    _copy(int(dst), host.ctypes.data, host.nbytes)


memcpy_htod = memcpy_htod_async


def memset_d8_async(dst, value, count, stream=None):
    Memory.check(int(dst), count, "memset_d8")
    ctypes.memset(int(dst), value, count)


def memcpy_dtoh_async(host, src, stream=None):
    if not host.flags.c_contiguous:
        raise LogicError("memcpy_dtoh into a non-contiguous array")
    Memory.check(int(src), host.nbytes, "memcpy_dtoh")
    _copy(host.ctypes.data, int(src), host.nbytes)


memcpy_dtoh = memcpy_dtoh_async


def pagelocked_empty(shape, dtype):
    return np.zeros(shape, dtype)


def module_from_buffer(binary):
    """The module of a binary the stand-in's compiler made (its source)."""
    from .compiler import SourceModule
    return SourceModule.from_binary(binary)


def get_driver_version():
    return 13000


def init():
    pass


class Stream:
    _handles = iter(range(0x1000, 1 << 30, 16))

    def __init__(self):
        self.handle = next(self._handles)

    def synchronize(self):
        pass

    def wait_for_event(self, event):
        if not isinstance(event, Event):
            raise LogicError(f"wait_for_event takes an Event, not {type(event).__name__}")


class Event:
    def record(self, stream=None):
        if stream is not None and not isinstance(stream, Stream):
            raise LogicError("Event.record takes a Stream")
        return self

    def synchronize(self):
        return self

    def query(self):
        return True

    def time_since(self, start):
        return 0.01


class Context:
    stack = []

    def push(self):
        Context.stack.append(self)

    @staticmethod
    def pop():
        if not Context.stack:
            raise LogicError("pop of an empty context stack")
        Context.stack.pop()


class Device:
    _context = Context()

    def __init__(self, index):
        if not 0 <= index < self.count():
            raise LogicError(f"no device {index}")

    @staticmethod
    def count():
        return 1

    def name(self):
        return "CUDA stand-in"

    def compute_capability(self):
        return COMPUTE_CAPABILITY

    def total_memory(self):
        return TOTAL

    def get_attributes(self):
        return dict(ATTRIBUTES)

    def get_attribute(self, name):
        return ATTRIBUTES[name]

    def retain_primary_context(self):
        return self._context
