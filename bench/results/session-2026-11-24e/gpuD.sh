# the 16-bit copies (half_operands, two elements a work-item) under every product path
source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
timeout 440 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_precision.py \
    -k "cuda and (bf16 or fp16) and (gemm_in or ties or bits)" 2>&1 | tail -12 \
    | tee $OUT/tests-precision-16.txt
