# session 27b, call 5: why fp16's ResNet step got slower (call 4: 28.7 -> 41.6 ms at batch
# 512) where bf16's got faster: one eager step traced, fp16 after and before, bf16 after.
source bench/gpu_setup.sh
ROOT=$PWD
S=$ROOT/bench/results/session-2026-11-27b
cd /tmp
prof() {   # tree, precision, file
  (timeout 150 env PYTHONPATH=$1:$PYTHONPATH python3 $S/resnet_profile.py cuda 512 $2 \
     > $OUT/$3.txt 2>&1; echo "rc $?" >> $OUT/$3.txt)
}
prof $ROOT fp16 profile-fp16-after
prof $ROOT/.base fp16 profile-fp16-before
prof $ROOT bf16 profile-bf16-after
for f in profile-fp16-after profile-fp16-before profile-bf16-after; do echo "== $f"; tail -32 $OUT/$f.txt; done
