source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
timeout 560 python3 -m pytest -q -p no:cacheprovider -rfE tests -k "cuda or nvidia" \
    --ignore=tests/test_kernels.py --ignore=tests/test_conv.py 2>&1 | tail -40 \
    | tee $OUT/gpu-suite-rest.txt
