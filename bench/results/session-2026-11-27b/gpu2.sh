# session 27b, call 2: the second half of the whole suite (test_l* .. test_z*) on cuda and
# NVIDIA's OpenCL at the last session's final tree (4402321, carried as .base): session 27
# ran it to 81% and 88% only. test_r* .. test_z* here; test_l* .. test_p* in call 1.
source bench/gpu_setup.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/pytest_xdist*.whl \
    .whl/execnet*.whl || exit 1
cd .base
FILES=$(ls tests/test_[r-z]*.py)
timeout 560 env PYTHONPATH=$PWD:$PYTHONPATH python3 -m pytest $FILES -q \
  -p no:cacheprovider -n 12 -k "cuda or nvidia" > $OUT/tests-2.log 2>&1
echo "rc $?" >> $OUT/tests-2.log
grep -E "^(FAILED|ERROR)" $OUT/tests-2.log | head -30; tail -8 $OUT/tests-2.log
