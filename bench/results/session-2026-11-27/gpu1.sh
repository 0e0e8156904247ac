# session 27, call 1: 16-bit storage for convolutions, pooling and Dropout on the H100. The
# tests that touch it (storage, convolutions, the precisions, loss scaling, on cuda and
# NVIDIA's OpenCL), then LeNet's step at batches 256 and 2048 in fp32, bf16 and fp16 with
# the tree before (78b74ea, carried in .before) and after, alternating.
source bench/gpu_setup.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/pytest_xdist*.whl \
    .whl/execnet*.whl || exit 1
ROOT=$PWD
S=bench/results/session-2026-11-27
timeout 300 env PYTHONPATH=$ROOT:$PYTHONPATH python3 -m pytest tests/test_storage16.py \
  tests/test_conv.py tests/test_precision.py tests/test_loss_scaling.py -q -p no:cacheprovider \
  -n 8 -k "cuda or nvidia" > $OUT/tests-1.txt 2>&1
echo "rc $?" >> $OUT/tests-1.txt
grep -E "^(FAILED|ERROR)" $OUT/tests-1.txt | head -30; tail -6 $OUT/tests-1.txt
step() {   # tree, file, extra env
  (cd /tmp && timeout 100 env PYTHONPATH=$1:$PYTHONPATH $3 python3 $ROOT/$S/cnn_step.py cuda \
     256 2048 >> $OUT/$2.jsonl 2> $OUT/$2.err; echo "rc $?" >> $OUT/$2.err; cat $OUT/$2.jsonl)
}
step $ROOT/.before before-1
step $ROOT after-1 TORCH=1
step $ROOT/.before before-2
step $ROOT after-2
