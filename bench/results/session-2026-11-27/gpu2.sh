# session 27, call 2: the tree before (78b74ea) met an illegal memory access in LeNet's first
# bf16 step (call 1). Which kernel (compute-sanitizer), whether recording routing's trials
# (PORTANET_GRAPHS) matters, and whether this tree meets it where convolutions store float32
# (BatchNorm after them); then the profiles of LeNet's step in each precision, this tree.
source bench/gpu_setup.sh
ROOT=$PWD
S=$ROOT/bench/results/session-2026-11-27
run() {   # name, tree, env...
  local name=$1 tree=$2; shift 2
  (cd /tmp && timeout 100 env PYTHONPATH=$tree:$PYTHONPATH "$@" python3 $S/crash.py \
     > $OUT/$name.txt 2>&1; echo "rc $?" >> $OUT/$name.txt; echo "== $name"; tail -3 $OUT/$name.txt)
}
run crash-before $ROOT/.before
run crash-before-nographs $ROOT/.before PORTANET_GRAPHS=off
run crash-after $ROOT
run crash-after-bn $ROOT BN=1
run crash-before-bn $ROOT/.before BN=1
(cd /tmp && timeout 150 env PYTHONPATH=$ROOT/.before:$PYTHONPATH compute-sanitizer \
   --print-limit 5 python3 $S/crash.py > $OUT/sanitizer-before.txt 2>&1;
 echo "rc $?" >> $OUT/sanitizer-before.txt; head -60 $OUT/sanitizer-before.txt)
for p in fp32 bf16 fp16; do
  (cd /tmp && timeout 60 env PYTHONPATH=$ROOT:$PYTHONPATH python3 -m portanet.cli profile \
     lenet-step --device cuda --batch-size 2048 --precision $p > $OUT/profile-$p.txt 2>&1;
   echo "rc $?" >> $OUT/profile-$p.txt; head -45 $OUT/profile-$p.txt)
done
