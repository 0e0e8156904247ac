"""The counter-based hash behind dropout, lowbias32 (C. Wellons), as kernels_cl/random.h
computes it in OpenCL and CUDA: the same bits on every backend for the same key."""
import numpy as np


def mix32(h):
    """lowbias32 of a uint32 array, or of a Python int (taken mod 2^32; returns an int)."""
    if isinstance(h, (int, np.integer)):
        return int(mix32(np.array([h & 0xFFFFFFFF], dtype=np.uint32))[0])
    with np.errstate(over="ignore"):
        h = h ^ (h >> 16)
        h = h * np.uint32(0x7feb352d)
        h = h ^ (h >> 15)
        h = h * np.uint32(0x846ca68b)
        return h ^ (h >> 16)


def key_array(key):
    """The 32 bits of a key as the one-element int32 array a backend's dropout reads."""
    return np.array([key & 0xFFFFFFFF], dtype=np.uint32).view(np.int32)


def dropout_mask(n, key, rate, index=None):
    """The kernels' mask (kernels_cl/random.h's kept): uniform(key, i) >= rate for i < n, or
    for each i of `index` (elements' numbers, taken mod 2^32)."""
    with np.errstate(over="ignore"):
        i = np.arange(n, dtype=np.uint32) if index is None else \
            (np.asarray(index, np.int64) & 0xFFFFFFFF).astype(np.uint32)
        h = mix32(i * np.uint32(0x9E3779B1) + np.uint32(key & 0xFFFFFFFF))
    return (h >> 8).astype(np.float64) / 16777216.0 >= rate
