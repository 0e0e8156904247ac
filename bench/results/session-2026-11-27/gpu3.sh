# session 27, call 3: after the fixes of call 2's findings. (1) _operands16 read a chunk's
# columns past its array (compute-sanitizer, call 2): the tree before, 78b74ea, carried in
# .before with that one fix applied so that it runs; (2) 16-bit operands skip OPERAND's
# rounding. The tests that touch them on cuda and NVIDIA's OpenCL, the BatchNorm CNN that
# crashed, then LeNet's step at batches 256 and 2048, before and after alternating, and
# this tree's profiles in bf16 and fp16.
source bench/gpu_setup.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/pytest_xdist*.whl \
    .whl/execnet*.whl || exit 1
ROOT=$PWD
S=$ROOT/bench/results/session-2026-11-27
timeout 240 env PYTHONPATH=$ROOT:$PYTHONPATH python3 -m pytest tests/test_storage16.py \
  tests/test_conv.py tests/test_precision.py -q -p no:cacheprovider -n 8 \
  -k "cuda or nvidia" > $OUT/tests-3.txt 2>&1
echo "rc $?" >> $OUT/tests-3.txt
grep -E "^(FAILED|ERROR)" $OUT/tests-3.txt | head -30; tail -5 $OUT/tests-3.txt
for bn in 0 1; do
  (cd /tmp && BN=$bn timeout 60 env PYTHONPATH=$ROOT:$PYTHONPATH python3 $S/crash.py 2>&1 | tail -2)
done
step() {   # tree, file
  (cd /tmp && timeout 80 env PYTHONPATH=$1:$PYTHONPATH PRECISIONS=bf16,fp16 python3 \
     $S/cnn_step.py cuda 256 2048 >> $OUT/$2.jsonl 2> $OUT/$2.err; echo "rc $?" >> $OUT/$2.err)
}
step $ROOT/.before before-3
step $ROOT after-3
step $ROOT/.before before-3
step $ROOT after-3
cat $OUT/before-3.jsonl $OUT/after-3.jsonl; tail -2 $OUT/before-3.err $OUT/after-3.err
for p in bf16 fp16; do
  (cd /tmp && timeout 60 env PYTHONPATH=$ROOT:$PYTHONPATH python3 -m portanet.cli profile \
     lenet-step --device cuda --batch-size 2048 --precision $p > $OUT/profile-$p-3.txt 2>&1;
   echo "rc $?" >> $OUT/profile-$p-3.txt; grep -A12 "^costliest" $OUT/profile-$p-3.txt)
  (cd /tmp && timeout 60 env PYTHONPATH=$ROOT/.before:$PYTHONPATH python3 -m portanet.cli \
     profile lenet-step --device cuda --batch-size 2048 --precision $p \
     > $OUT/profile-$p-before-3.txt 2>&1; echo "rc $?" >> $OUT/profile-$p-before-3.txt;
   grep -A12 "^costliest" $OUT/profile-$p-before-3.txt)
done
