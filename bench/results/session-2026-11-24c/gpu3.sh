source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
timeout 100 python3 build/s9/mma_variants.py $OUT/mma-final.txt 2>&1 | tail -20
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_precision.py -k "cuda or not \
    (gemm or dense or training)" 2>&1 | tail -5 | tee $OUT/tests-precision.txt
timeout 250 python3 -m portanet.cli bench --device cuda --workload gemm --workload mlp-big \
    --workload mlp-small --workload lenet-step --precision fp32 --precision tf32 --json \
    $OUT/bench-precision.json 2>&1 | tail -16 | tee $OUT/bench-precision.txt
