# session 27, call 6: the fused 16-bit epilogue (C_HALF) and the recording fix, after call 5
# found a recording made during capture. conv16.py, LeNet's step before (78b74ea
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
step $ROOT/.before before-6
step $ROOT after-6
step $ROOT/.before before-6
step $ROOT after-6
cat $OUT/before-6.jsonl $OUT/after-6.jsonl
timeout 60 env PYTHONPATH=$ROOT:$PYTHONPATH python3 -m portanet.cli profile lenet-step \
  --device cuda --batch-size 2048 --precision bf16 > $OUT/profile-bf16-6.txt 2>&1
grep -E "conv|^step" $OUT/profile-bf16-6.txt
cd $ROOT
timeout 360 env PYTHONPATH=$ROOT:$PYTHONPATH python3 -m pytest tests/test_storage16.py \
  tests/test_precision.py tests/test_conv.py tests/test_graphs.py tests/test_loss_scaling.py \
  -q -p no:cacheprovider -n 8 \
  -k "cuda or nvidia" > $OUT/tests-6.log 2>&1
echo "rc $?" >> $OUT/tests-6.log
grep -E "^(FAILED|ERROR)" $OUT/tests-6.log | head -30; tail -6 $OUT/tests-6.log
