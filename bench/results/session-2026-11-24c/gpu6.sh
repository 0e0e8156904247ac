source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
timeout 150 python3 -m portanet.cli devices --check --device cuda 2>&1 | tail -2 | tee \
    $OUT/devices-check.txt
timeout 330 python3 -m pytest -q -p no:cacheprovider tests/test_precision.py tests/test_check.py \
    tests/test_kernel_sources.py -k "cuda or sources" 2>&1 | tail -6 | tee $OUT/tests-tf32.txt
timeout 100 python3 -m portanet.cli bench --device cuda --workload mlp-small --workload \
    lenet-step --precision tf32 --json $OUT/bench-tf32-final.json 2>&1 | tail -5 | tee \
    $OUT/bench-tf32-final.txt
