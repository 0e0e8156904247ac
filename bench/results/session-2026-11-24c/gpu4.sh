source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
timeout 540 python3 -m pytest -q -p no:cacheprovider -x tests -k "cuda" \
    --ignore=tests/test_kernels.py --ignore=tests/test_conv.py --ignore=tests/test_precision.py \
    2>&1 | tail -8 | tee $OUT/tests-suite-cuda.txt
