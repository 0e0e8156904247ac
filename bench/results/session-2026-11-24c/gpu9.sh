source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
timeout 250 python3 -m pytest -q -p no:cacheprovider tests/test_precision.py tests/test_conv.py \
    -k "cuda or nvidia" 2>&1 | tail -6 | tee $OUT/tests-review-1.txt
timeout 270 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py -k "(gemm or dense or \
    rout or split) and (cuda or nvidia)" 2>&1 | tail -6 | tee $OUT/tests-review-2.txt
