source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
timeout 120 python3 build/s9/mma_variants.py $OUT/mma-variants.txt 2>&1 | tail -40
timeout 380 python3 -m pytest -q -p no:cacheprovider tests/test_precision.py \
    tests/test_kernel_sources.py tests/test_kernels.py -k "precision or sources or ((gemm or \
    dense or rout or tilings or split) and (cuda or nvidia))" 2>&1 | tail -8 | tee \
    $OUT/tests.txt
