# session 27b, call 1: the second half of the whole suite (test_l* .. test_z*) on cuda and
# NVIDIA's OpenCL at the last session's final tree (4402321, carried as .base): session 27
# ran it to 81% and 88% only. test_l* .. test_p* here, test_r* .. test_z* in call 2.
source bench/gpu_setup.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/pytest_xdist*.whl \
    .whl/execnet*.whl || exit 1
cd .base
FILES=$(ls tests/test_[l-p]*.py)
timeout 560 env PYTHONPATH=$PWD:$PYTHONPATH python3 -m pytest $FILES -q \
  -p no:cacheprovider -n 12 -k "cuda or nvidia" > $OUT/tests-1.log 2>&1
echo "rc $?" >> $OUT/tests-1.log
grep -E "^(FAILED|ERROR)" $OUT/tests-1.log | head -30; tail -8 $OUT/tests-1.log
