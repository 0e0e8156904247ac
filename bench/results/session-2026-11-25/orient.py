"""mlp-big's forward products in each orientation cuBLAS can be asked for, in fp32 (sgemm),
tf32 (gemmEx, COMPUTE_32F_FAST_TF32) and bf16 (gemmEx, 16-bit inputs, float32 c): with our
feature-major layout, z (out x batch, row-major) is column-major C = (batch x out):
  NN  A = x (batch x in), B = w (in x out)                 what portanet runs today
  TN  A = x transposed copy (in x batch, column-major)     needs a copy of x
  NT  B = w transposed copy                                needs a copy of w
  TT* C' = (out x batch): z samples-first, no copies        needs a transposing epilogue
and what the copies cost (torch's copy_, one pass)."""
import numpy as np, torch
from nvmath.bindings import cublas

stream = torch.cuda.current_stream().cuda_stream
h = cublas.create(); cublas.set_stream(h, stream)
OP = {"N": cublas.Operation.N, "T": cublas.Operation.T}
R32F, R16BF = 0, 14
CT = cublas.ComputeType

def timed(f, reps=7):
    f(); f(); torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    for _ in range(reps):
        s.record(); f(); e.record(); e.synchronize(); out.append(s.elapsed_time(e))
    return float(np.median(out))

def gemm(prec, ta, tb, m, n, k):
    dt = torch.bfloat16 if prec == "bf16" else torch.float32
    A = torch.randn((k, m) if ta == "N" else (m, k), device="cuda").to(dt)
    B = torch.randn((n, k) if tb == "N" else (k, n), device="cuda").to(dt)
    C = torch.zeros((n, m), device="cuda")
    ab = np.array([1.0, 0.0], np.float32)
    if prec == "fp32":
        f = lambda: cublas.sgemm(h, OP[ta], OP[tb], m, n, k, ab.ctypes.data, A.data_ptr(),
                                 A.shape[1], B.data_ptr(), B.shape[1], ab.ctypes.data + 4,
                                 C.data_ptr(), m)
    else:
        kind = R16BF if prec == "bf16" else R32F
        ct = CT.COMPUTE_32F if prec == "bf16" else CT.COMPUTE_32F_FAST_TF32
        f = lambda: cublas.gemm_ex(h, OP[ta], OP[tb], m, n, k, ab.ctypes.data, A.data_ptr(),
                                   kind, A.shape[1], B.data_ptr(), kind, B.shape[1],
                                   ab.ctypes.data + 4, C.data_ptr(), R32F, m, ct, -1)
    t = timed(f)
    del A, B, C
    return t

def copy_time(rows, cols, dt, transpose):
    x = torch.randn(rows, cols, device="cuda")
    y = torch.empty((cols, rows) if transpose else (rows, cols), device="cuda", dtype=dt)
    src = x.t() if transpose else x
    return timed(lambda: y.copy_(src))

print(torch.cuda.get_device_name())
for name, out, inp, batch in (("layer 1", 5000, 10000, 10000), ("layer 2", 1000, 5000, 10000)):
    print(f"{name}: {inp} -> {out}, batch {batch}")
    for prec in ("fp32", "tf32", "bf16"):
        row = {"NN": gemm(prec, "N", "N", batch, out, inp),
               "TN(x copy)": gemm(prec, "T", "N", batch, out, inp),
               "NT(w copy)": gemm(prec, "N", "T", batch, out, inp),
               "TT(z samples-first)": gemm(prec, "T", "T", out, batch, inp)}
        print(f"  {prec}: " + ", ".join(f"{k} {v:.3f}" for k, v in row.items()) + " ms")
    for what, rows, cols in (("x", inp, batch), ("w", out, inp)):
        for dt in (torch.float32, torch.bfloat16):
            print(f"  copy of {what} {rows}x{cols} to {str(dt)[6:]}: straight "
                  f"{copy_time(rows, cols, dt, False):.3f} ms, transposed "
                  f"{copy_time(rows, cols, dt, True):.3f} ms")
