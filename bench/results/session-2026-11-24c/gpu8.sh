source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_precision.py \
    tests/test_kernel_sources.py -k "cuda or sources" 2>&1 | tail -5 | tee \
    $OUT/tests-tf32-final.txt
timeout 120 python3 -m portanet.cli bench --device cuda --device opencl:nvidia --workload gemm \
    --precision fp32 --precision tf32 --no-torch --json $OUT/bench-schema2.json 2>&1 | tail -14 \
    | tee $OUT/bench-schema2.txt
