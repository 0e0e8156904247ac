# session 27b, call 4: call 3's ResNet steps ran out of time (each tree's first step builds
# its kernels and routes its convolutions: minutes). Here bf16 and fp16 only, after then
# before, without PyTorch (call 3 has its column).
source bench/gpu_setup.sh
ROOT=$PWD
S=$ROOT/bench/results/session-2026-11-27b
cd /tmp
step() {   # tree, file
  (timeout 280 env PYTHONPATH=$1:$PYTHONPATH PRECISIONS=bf16,fp16 python3 $S/resnet_step.py \
     cuda 128 512 >> $OUT/$2.jsonl 2> $OUT/$2.err; echo "rc $?" >> $OUT/$2.err)
}
step $ROOT after-3
step $ROOT/.base before-3
for f in after-3 before-3; do echo "== $f"; cat $OUT/$f.jsonl; tail -2 $OUT/$f.err; done
