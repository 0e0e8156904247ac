#!/usr/bin/env bash
# The test suite on a GPU host: `portanet devices --check` on every device there, then
# pytest (-n 8 where pytest-xdist's wheels are carried in .whl). Arguments go to pytest;
# without them, every test on cuda and NVIDIA's OpenCL (the whole suite takes more than one
# 10-minute call: give it in parts, e.g. tests/test_[a-k]*.py, then tests/test_[l-z]*.py).
#   bash bench/gpu_suite.sh
#   bash bench/gpu_suite.sh tests/test_conv.py tests/test_precision.py -k cuda
# The log is $OUT/tests.txt.
source bench/gpu_setup.sh
ls .whl/pytest_xdist*.whl > /dev/null 2>&1 && python3 -m pip install -q --no-index \
    --no-deps --target /tmp/site .whl/pytest_xdist*.whl .whl/execnet*.whl && parallel="-n 8"
timeout 120 python3 -m portanet.cli devices --check 2>&1 | grep -v Warning \
    | tee "$OUT/devices-check.txt"
[ $# -gt 0 ] || set -- tests -k "cuda or nvidia"
timeout ${SECONDS_LIMIT:-420} python3 -m pytest -q -rs -p no:cacheprovider $parallel "$@" \
    > "$OUT/tests.txt" 2>&1
echo "rc $?" >> "$OUT/tests.txt"
grep -E "^(FAILED|ERROR)" "$OUT/tests.txt" | head -30; tail -6 "$OUT/tests.txt"
