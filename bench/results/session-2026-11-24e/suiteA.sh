source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
timeout 560 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_kernels.py tests/test_conv.py \
    -k "cuda or nvidia" 2>&1 | tail -40 | tee $OUT/gpu-suite-kernels-conv.txt
