source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
timeout 150 python3 -m portanet.cli devices --check --device cuda 2>&1 | tail -3 | tee \
    $OUT/devices-check.txt
timeout 420 python3 -m pytest -q -p no:cacheprovider tests/test_precision.py -k "cuda" \
    2>&1 | tail -30 | tee $OUT/tests-precision.txt
