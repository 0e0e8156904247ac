"""The 16-bit shadow copies of GEMM operands, in one place: under bf16 and fp16 the
vendor's and the tensor-core GEMMs read 16-bit copies of a product's inputs. Arrays the
network keeps (`keep_operands`: weights between updates) keep theirs until dropped;
others are copied into a workspace at each product."""
import math

import numpy as np


def _kept_key(x):
    """What keep_operands knows an array by: its owner, its place there and its shape."""
    return id(x.base or x), x.offset, x.shape


def _whole16(n):
    """n 16-bit elements rounded up to whole 16 bytes (where each 16-bit copy starts)."""
    return -(-n // 8) * 8


def _extent(x):
    """Elements from x's offset to the end of the array it is a view of (its base's), or
    of x itself: where a copy of a `_columns` view, whose shape runs past it, stops."""
    owner = x if x.base is None else x.base
    return owner.offset + owner.size - x.offset


class Shadows:
    """KernelBackend's 16-bit operand copies (see the module's docstring)."""

    def operand_bytes(self, products, kept=()):
        itemsize = self.dtype.itemsize
        if self.half_operands is None:      # room for a copy of a, where routing may try it
            needed = max((a for a, b, c in products
                          if self._transposes(2 * math.sqrt(a * b * c))), default=0)
            ws = getattr(self, "_transposed_ws", None)
            held = ws.size if ws is not None else 0
            return {"transposed operands": (needed * itemsize, held * itemsize,
                                            self.dtype)} if needed else {}
        needed = max((_whole16(a) + _whole16(b) for a, b, c in products), default=0)
        needed += sum(_whole16(n) for n in kept)
        ws = getattr(self, "_half_ws", None)
        held = sum(x.size for x in (ws, *self._shadows.values()) if x is not None)
        dtype = np.dtype(self.half_operands)
        return {"16-bit operands": (needed * dtype.itemsize, held * dtype.itemsize,
                                    dtype)} if needed else {}

    def keep_operands(self, *arrays):
        """Where products copy their inputs to 16 bits (half_operands), the next copy of
        each array goes into a buffer of its own, made the first time and freed with the
        array (`_shadow`), and later products read it instead of copying again, until
        drop_operands; the kernels that write a layer's output (bias_activation, and
        activation_grad and activation_bias_grad in place) write that copy beside it
        (`_copy_beside`), so that no product copies it at all. The caller vouches that
        nothing else writes the array in between. Keeping a kept array changes nothing."""
        if self.half_operands is not None:
            for key in map(_kept_key, (x for x in arrays if not self._stored(x))):
                if key not in self._keeping:
                    self._keeping.add(key)
                    self._fresh.discard(key)

    def drop_operands(self, *arrays):
        for key in map(_kept_key, arrays):
            self._keeping.discard(key)
            self._fresh.discard(key)

    def drop_all_operands(self):
        self._keeping.clear()
        self._fresh.clear()

    def _shadow(self, x):
        """x's kept 16-bit copy (a view of its owner's shadow, at x's place in the owner),
        and whether it holds x now; None where x is not kept, or does not start at whole
        16 bytes of its owner."""
        key = _kept_key(x)
        owner = x.base or x
        place = x.offset - owner.offset
        if key not in self._keeping or place % 8:
            return None, False
        shadow = self._shadows.get(owner)
        if shadow is None:
            shadow = self._shadows[owner] = self.empty((owner.size,), self.half_operands,
                                                       label="kept 16-bit operands")
        return self.view(shadow, x.shape, place), key in self._fresh

    def _copy_beside(self, x):
        """(h, shadow) for a kernel that writes x and can write its 16-bit copy beside it
        (STORE_HALF): x's kept copy and 1, which then holds x; else x itself (never
        written through h) and 0."""
        kept, _ = self._shadow(x) if self._keeping else (None, False)
        if kept is None:
            return x, 0
        self._fresh.add(_kept_key(x))
        return kept, 1

    def _half_workspace(self, size):
        """The 16-bit operand workspace, grown to at least `size` elements: the copies of
        one product's inputs, whichever GEMM reads them (the vendor's, or our tensor-core
        one where it takes 16-bit inputs)."""
        return self._workspace("_half_ws", size, "16-bit operand workspace",
                               self.half_operands)[0]

    def _operands16(self, a, b):
        """a and b as the vendor's 16-bit GEMM takes them (half_operands): each rounded as our
        own kernels round a product's inputs (prelude.h's half_bits), laid out as it was,
        in the operand workspace, which grows to the largest product's pair. The kernel
        writes two elements a word, and each copy starts at a whole 16 bytes (`_whole16`,
        as the tensor path's copies in the same workspace do)."""
        ws = self._half_workspace(_whole16(a.size) + _whole16(b.size))
        kernel = self._kernels.get("half_operands")
        if kernel is None:
            kernel = self._kernels["half_operands"] = self._build("elementwise", "half_operands")
        out = []
        for x, start in ((a, 0), (b, _whole16(a.size))):
            if self._stored(x):             # 16 bits already: read where it is
                out.append(x)
                continue
            kept, fresh = self._shadow(x)
            y = kept if kept is not None else self.view(ws, x.shape, start)
            if not fresh:
                n = min(x.size, _extent(x))     # (a chunk's columns: to its array's end)
                self._run(kernel, ((n + 1) // 2,), y, x, n, label=f"{self.precision} operands")
                if kept is not None:
                    self._fresh.add(_kept_key(x))
            out.append(y)
        return out
