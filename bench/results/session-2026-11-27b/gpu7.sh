# session 27b, call 7 (the machine of call 6, kernels and routes built): the ResNet's step
# at batches 128 and 512 in each precision, after (this tree) and before (6c80633, .mid),
# alternating.
source bench/gpu_setup.sh
ROOT=$PWD
S=$ROOT/bench/results/session-2026-11-27b
cd /tmp
step() {   # tree, file
  (timeout 100 env PYTHONPATH=$1:$PYTHONPATH python3 $S/resnet_step.py cuda 128 512 \
     >> $OUT/$2.jsonl 2> $OUT/$2.err; echo "rc $?" >> $OUT/$2.err)
}
step $ROOT after-7
step $ROOT/.mid before-7
step $ROOT after-7b
for f in after-7 before-7 after-7b; do echo "== $f"; cat $OUT/$f.jsonl; tail -1 $OUT/$f.err; done
