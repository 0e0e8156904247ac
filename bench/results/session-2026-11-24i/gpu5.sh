# session 17, call 5: the precision tests through mma.cu and wgmma.cu after _kernel's cache
source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
timeout 520 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_precision.py \
  -k "cuda and (hopper or ties or views or (gemm_in_lower and (136 or 1000)))" > $OUT/tests-precision.txt 2>&1
tail -5 $OUT/tests-precision.txt
