"""cuBLAS's calls that portanet makes, checked against the stand-in's memory (pycuda's):
the pointers and leading dimensions must fit live allocations; nothing is computed."""
import enum

from pycuda import driver

calls = []


class Math(enum.IntEnum):
    DEFAULT_MATH = 0
    TF32_TENSOR_OP_MATH = 3


class ComputeType(enum.IntEnum):
    COMPUTE_32F = 68


_SIZES = {0: 4, 2: 2, 14: 2}        # cudaDataType: R_32F, R_16F, R_16BF


def create():
    return 1


def set_stream(handle, stream):
    pass


def set_math_mode(handle, mode):
    Math(mode)


def _operand(what, address, trans, rows, cols, ld, itemsize):
    """op(x) is rows x cols, column-major; x itself is cols x rows where transposed."""
    stored_rows, stored_cols = (cols, rows) if trans else (rows, cols)
    if ld < max(1, stored_rows):
        raise driver.LogicError(f"{what}: leading dimension {ld} < {stored_rows}")
    driver.Memory.check(address, ((stored_cols - 1) * ld + stored_rows) * itemsize, what)


def _gemm(name, trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc, size_in, size_out):
    for t in (trans_a, trans_b):
        if t not in (0, 1):
            raise driver.LogicError(f"{name}: operation {t}")
    _operand(f"{name} A", a, trans_a, m, k, lda, size_in)
    _operand(f"{name} B", b, trans_b, k, n, ldb, size_in)
    _operand(f"{name} C", c, 0, m, n, ldc, size_out)
    calls.append(name)


def sgemm(handle, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
    _gemm("sgemm", trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc, 4, 4)


def dgemm(handle, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
    _gemm("dgemm", trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc, 8, 8)


def gemm_ex(handle, trans_a, trans_b, m, n, k, alpha, a, a_type, lda, b, b_type, ldb, beta,
            c, c_type, ldc, compute_type, algo):
    if a_type != b_type or c_type != 0:
        raise driver.LogicError(f"gemm_ex types {a_type}, {b_type} -> {c_type}")
    ComputeType(compute_type)
    _gemm("gemm_ex", trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc, _SIZES[a_type],
          _SIZES[c_type])
