"""mlp-big's products as our cuda backend calls cuBLAS (column-major view), timed with
cublasSgemm and with each algorithm cublasLt's heuristic offers (16 at most)."""
import numpy as np, torch
from nvmath.bindings import cublasLt as lt, cublas

R32F = 0
stream = torch.cuda.current_stream().cuda_stream
hb = cublas.create(); cublas.set_stream(hb, stream)
hl = lt.create()
WS = 64 << 20
ws = torch.empty(WS, dtype=torch.uint8, device="cuda")
OP = {"N": cublas.Operation.N, "T": cublas.Operation.T}

def setattr_(setter, getdtype, obj, attr, value):
    buf = np.array([value], dtype=getdtype(attr))
    setter(obj, attr, buf.ctypes.data, buf.itemsize)

def timed(f, reps=5):
    f(); torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    for _ in range(reps):
        s.record(); f(); e.record(); e.synchronize(); out.append(s.elapsed_time(e))
    return float(np.median(out))

def case(label, ta, tb, m, n, k, beta):
    A = torch.randn((k, m) if ta == "N" else (m, k), device="cuda")   # col-major op(A) m x k
    B = torch.randn((n, k) if tb == "N" else (k, n), device="cuda")
    C = torch.randn((n, m), device="cuda")
    lda, ldb = A.shape[1], B.shape[1]
    ab = np.array([1.0, beta], np.float32)
    sg = lambda: cublas.sgemm(hb, OP[ta], OP[tb], m, n, k, ab.ctypes.data, A.data_ptr(), lda,
                              B.data_ptr(), ldb, ab.ctypes.data + 4, C.data_ptr(), m)
    flops = 2 * m * n * k
    t = timed(sg)
    print(f"{label}: {ta}{tb} m={m} n={n} k={k} beta={beta}")
    print(f"   cublasSgemm                       {t:8.3f} ms  {flops / t / 1e9:6.1f} TFLOP/s")
    desc = lt.matmul_desc_create(cublas.ComputeType.COMPUTE_32F, R32F)
    D = lt.MatmulDescAttribute
    setattr_(lt.matmul_desc_set_attribute, lt.get_matmul_desc_attribute_dtype, desc, D.TRANSA,
             OP[ta])
    setattr_(lt.matmul_desc_set_attribute, lt.get_matmul_desc_attribute_dtype, desc, D.TRANSB,
             OP[tb])
    Ad = lt.matrix_layout_create(R32F, *((m, k) if ta == "N" else (k, m)), lda)
    Bd = lt.matrix_layout_create(R32F, *((k, n) if tb == "N" else (n, k)), ldb)
    Cd = lt.matrix_layout_create(R32F, m, n, m)
    pref = lt.matmul_preference_create()
    setattr_(lt.matmul_preference_set_attribute, lt.get_matmul_preference_attribute_dtype, pref,
             lt.MatmulPreferenceAttribute.MAX_WORKSPACE_BYTES, WS)
    res = np.zeros(16, dtype=lt.matmul_heuristic_result_dtype)
    count = np.zeros(1, np.int32)
    lt.matmul_algo_get_heuristic(hl, desc, Ad, Bd, Cd, Cd, pref, 16, res.ctypes.data,
                                 count.ctypes.data)
    off = res.dtype.fields["algo"][1]
    for i in range(int(count[0])):
        algo = res.ctypes.data + i * res.itemsize + off
        f = lambda algo=algo: lt.matmul(hl, desc, ab.ctypes.data, A.data_ptr(), Ad,
                                        B.data_ptr(), Bd, ab.ctypes.data + 4, C.data_ptr(), Cd,
                                        C.data_ptr(), Cd, algo, ws.data_ptr(), WS, stream)
        try:
            t = timed(f)
        except Exception as e:
            print(f"   lt algo {i:2d}: {e}"); continue
        print(f"   lt algo {i:2d} (workspace {int(res['workspace_size'][i]) >> 10:6d} KiB, "
              f"waves {float(res['waves_count'][i]):5.2f}) {t:8.3f} ms  "
              f"{flops / t / 1e9:6.1f} TFLOP/s")

torch.backends.cuda.matmul.allow_tf32 = False
case("z1 (forward)", "N", "N", 10000, 5000, 10000, 0.0)
case("z1 as torch orients it", "T", "N", 5000, 10000, 10000, 0.0)
case("dW1 (momentum in beta)", "T", "N", 10000, 5000, 10000, 0.9)
case("z2 (forward)", "N", "N", 10000, 1000, 5000, 0.0)
case("dW2", "T", "N", 5000, 1000, 10000, 0.9)
case("dx2", "N", "T", 10000, 5000, 1000, 0.0)
x = torch.randn(10000, 10000, device="cuda"); w = torch.randn(5000, 10000, device="cuda")
print(f"torch x @ w.T (torch's forward)       {timed(lambda: x @ w.T):8.3f} ms")
print(f"torch w @ x (ours: NN)                  {timed(lambda: w @ x):8.3f} ms")
