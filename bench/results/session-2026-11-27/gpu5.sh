# session 27, call 5: 16-bit operands converted when stored into the slab (call 4 found the
# conversion at the load slowing the gathers). conv16.py again, LeNet's step before (78b74ea
# with the copy's fix) and after alternating, then the tests on cuda and NVIDIA's OpenCL.
source bench/gpu_setup.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/pytest_xdist*.whl \
    .whl/execnet*.whl || exit 1
ROOT=$PWD
S=$ROOT/bench/results/session-2026-11-27
cd /tmp
for p in bf16 fp16; do
  timeout 60 env PYTHONPATH=$ROOT:$PYTHONPATH python3 $S/conv16.py $p 2>&1 | tail -6
done
step() {   # tree, file
  (timeout 80 env PYTHONPATH=$1:$PYTHONPATH PRECISIONS=bf16,fp16 python3 \
     $S/cnn_step.py cuda 256 2048 >> $OUT/$2.jsonl 2> $OUT/$2.err; echo "rc $?" >> $OUT/$2.err)
}
step $ROOT/.before before-5
step $ROOT after-5
step $ROOT/.before before-5
step $ROOT after-5
cat $OUT/before-5.jsonl $OUT/after-5.jsonl
timeout 60 env PYTHONPATH=$ROOT:$PYTHONPATH python3 -m portanet.cli profile lenet-step \
  --device cuda --batch-size 2048 --precision bf16 > $OUT/profile-bf16-5.txt 2>&1
grep -E "conv|^step" $OUT/profile-bf16-5.txt
cd $ROOT
timeout 330 env PYTHONPATH=$ROOT:$PYTHONPATH python3 -m pytest tests/test_storage16.py \
  tests/test_precision.py tests/test_conv.py -q -p no:cacheprovider -n 8 -x \
  -k "cuda or nvidia" > $OUT/tests-5.log 2>&1
echo "rc $?" >> $OUT/tests-5.log
grep -E "^(FAILED|ERROR)" $OUT/tests-5.log | head -30; tail -6 $OUT/tests-5.log
