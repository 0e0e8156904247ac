# issue 18: wgmma.cu, our Hopper tensor-core GEMM from 16-bit inputs: SASS, correctness,
# rate against cuBLAS; the precision tests on cuda
source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
python3 - <<'PY' > /tmp/wg.cu
from portanet.backends import sources
print(sources.load("wgmma", "cu")[1])
PY
for opt in "-DOPERAND_BITS=7" "-DOPERAND_BITS=10 -DOPERAND_HALF=1"; do
  nvcc --cubin -arch=sm_90a -DREAL=float -DREAL_IS_DOUBLE=0 $opt -Xptxas -v -o /tmp/wg.cubin \
    /tmp/wg.cu 2>&1 | grep -E "registers|spill" | tee -a $OUT/sass.txt
  cuobjdump -sass /tmp/wg.cubin | grep -oE "HGMMA\.[A-Z0-9.]+|UTMALDG[.A-Z0-9]*|SYNCS[.A-Z0-9]*|LDL|STL" \
    | sort | uniq -c | tee -a $OUT/sass.txt
done
timeout 240 python3 bench/results/session-2026-11-24h/wg_bench.py $OUT/wg-bench.txt 2>&1 | grep -v Warn | tail -60
timeout 200 python3 -m pytest -q -p no:cacheprovider -rfE -x tests/test_precision.py \
  -k "cuda and (gemm or ties or dense or memory_plan)" 2>&1 | tail -8 | tee $OUT/tests-precision.txt
