# session 27, call 8: the second half of the whole suite (test_l* .. test_z*) on cuda and
# NVIDIA's OpenCL, then LeNet's step at the final tree, before (78b74ea with the copy's fix)
# and after, alternating.
source bench/gpu_setup.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/pytest_xdist*.whl \
    .whl/execnet*.whl || exit 1
ROOT=$PWD
S=$ROOT/bench/results/session-2026-11-27
timeout 380 env PYTHONPATH=$ROOT:$PYTHONPATH python3 -m pytest $(ls tests/test_[l-z]*.py) -q \
  -p no:cacheprovider -n 8 -k "cuda or nvidia" > $OUT/tests-8.log 2>&1
echo "rc $?" >> $OUT/tests-8.log
grep -E "^(FAILED|ERROR)" $OUT/tests-8.log | head -30; tail -6 $OUT/tests-8.log
cd /tmp
step() {   # tree, file
  (timeout 80 env PYTHONPATH=$1:$PYTHONPATH PRECISIONS=bf16,fp16 python3 \
     $S/cnn_step.py cuda 256 2048 >> $OUT/$2.jsonl 2> $OUT/$2.err; echo "rc $?" >> $OUT/$2.err)
}
step $ROOT/.before before-8
step $ROOT after-8
cat $OUT/before-8.jsonl $OUT/after-8.jsonl
