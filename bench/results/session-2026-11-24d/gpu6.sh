source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
timeout 500 python3 -m pytest -q -p no:cacheprovider tests/test_precision.py -k "cuda" \
    2>&1 | tail -5 | tee $OUT/tests-precision-final.txt
timeout 60 python3 -m portanet.cli devices --check --device cuda 2>&1 | tail -2 | cut -c1-400 \
    | tee $OUT/devices-check-final.txt
