source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
timeout 200 python3 -m portanet.cli devices --check --device cuda --device opencl:nvidia 2>&1 | \
    tail -4 | tee $OUT/devices-check.txt
timeout 120 python3 -m portanet.cli profile mlp-small --device cuda --batch-size 1000 \
    --precision tf32 2>&1 | head -30 | tee $OUT/profile-mlp-small-tf32.txt
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_check.py tests/test_precision.py \
    -k "cuda or nvidia or tf32 or bench or command" 2>&1 | tail -6 | tee $OUT/tests-check.txt
