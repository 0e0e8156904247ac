# session 17, call 4 (after the second read): _kernel's one function object per build, one
# _workspace rule; products on every path in tf32/bf16/fp16 (mma.cu, wgmma.cu), our GEMM's
# split K and the update kernels on cuda and NVIDIA's OpenCL; _prepared stays bounded
source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
timeout 60 python3 - <<'PY' 2>&1 | grep -v Warn | tee $OUT/prepared.txt
import numpy as np, portanet
for p in ("tf32", "bf16"):
    bk = portanet.device("cuda", np.float32, p); bk.gemm_path = "own"
    a, b, c = (bk.upload(np.random.rand(256, 256).astype(np.float32)) for _ in range(3))
    for i in range(50):
        bk.gemm(1.0, a, b, 0.0, c)
        if i == 0: first = len(bk._prepared)
    bk.synchronize()
    print(p, "prepared after 1 product:", first, "after 50:", len(bk._prepared))
PY
timeout 250 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_precision.py \
  -k "cuda and (gemm_in_lower or hopper or ties or memory_plan)" 2>&1 | tail -5 | tee $OUT/tests-precision.txt
timeout 200 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_kernels.py tests/test_graphs.py \
  -k "(cuda or nvidia) and (split or momentum or bias_activation or graph)" 2>&1 | tail -6 | tee $OUT/tests-kernels.txt
