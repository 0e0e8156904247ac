# session 27b, call 3: BatchNorm and Residual blocks in 16-bit storage (6c80633). The tests
# of the kernels and layers it touched on cuda and NVIDIA's OpenCL, then the ResNet's
# training step before (4402321, carried as .base) and after, alternating, with PyTorch's
# same step beside the first "after".
source bench/gpu_setup.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/pytest_xdist*.whl \
    .whl/execnet*.whl || exit 1
ROOT=$PWD
S=$ROOT/bench/results/session-2026-11-27b
timeout 300 env PYTHONPATH=$ROOT:$PYTHONPATH python3 -m pytest tests/test_storage16.py \
  tests/test_batchnorm.py tests/test_kernels.py tests/test_semantics.py \
  tests/test_layer_gradients.py -q -p no:cacheprovider -n 12 -k "cuda or nvidia" \
  > $OUT/tests-3.log 2>&1
echo "rc $?" >> $OUT/tests-3.log
grep -E "^(FAILED|ERROR)" $OUT/tests-3.log | head -30; tail -8 $OUT/tests-3.log
cd /tmp
step() {   # tree, file, extra env
  (timeout 240 env PYTHONPATH=$1:$PYTHONPATH $3 python3 $S/resnet_step.py cuda 128 512 \
     >> $OUT/$2.jsonl 2> $OUT/$2.err; echo "rc $?" >> $OUT/$2.err)
}
step $ROOT after-1 TORCH=1
step $ROOT/.base before-1
step $ROOT after-2
step $ROOT/.base before-2
for f in after-1 before-1 after-2 before-2; do echo "== $f"; cat $OUT/$f.jsonl; tail -2 $OUT/$f.err; done
