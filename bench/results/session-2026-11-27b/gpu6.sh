# session 27b, call 6: BatchNorm in pieces. Its tests and the 16-bit networks' on cuda and
# NVIDIA's OpenCL; then the ResNet's step at batch 512 in each precision after (this tree)
# and before (6c80633, carried as .mid), and one eager bf16 and fp16 step traced after.
source bench/gpu_setup.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/pytest_xdist*.whl \
    .whl/execnet*.whl || exit 1
ROOT=$PWD
S=$ROOT/bench/results/session-2026-11-27b
timeout 170 env PYTHONPATH=$ROOT:$PYTHONPATH python3 -m pytest tests/test_batchnorm.py \
  tests/test_storage16.py -q -p no:cacheprovider -n 12 \
  -k "(cuda or nvidia) and (batchnorm or residual or trains or pieces or large)" \
  > $OUT/tests-6.log 2>&1
echo "rc $?" >> $OUT/tests-6.log
grep -E "^(FAILED|ERROR)" $OUT/tests-6.log | head -30; tail -8 $OUT/tests-6.log
cd /tmp
step() {   # tree, file
  (timeout 170 env PYTHONPATH=$1:$PYTHONPATH python3 $S/resnet_step.py cuda 512 \
     >> $OUT/$2.jsonl 2> $OUT/$2.err; echo "rc $?" >> $OUT/$2.err)
}
step $ROOT after-6
step $ROOT/.mid before-6
for f in after-6 before-6; do echo "== $f"; cat $OUT/$f.jsonl; tail -2 $OUT/$f.err; done
for p in bf16 fp16; do
  timeout 40 env PYTHONPATH=$ROOT:$PYTHONPATH python3 $S/resnet_profile.py cuda 512 $p \
    > $OUT/profile-$p-pieces.txt 2>&1
  echo "== $p"; tail -22 $OUT/profile-$p-pieces.txt
done
