# session 17, call 2: issue 11's per-process spread on NVIDIA's OpenCL (two contexts in one
# process, PYTHONHASHSEED fixed per process); mlp-small's step profiled on both paths
source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
for seed in 0 0 1 1 2 2 3 3; do
  PYTHONHASHSEED=$seed timeout 60 python3 bench/results/session-2026-11-24i/spread.py mlp-small 2>&1 | grep -v Warn | tail -1 | tee -a $OUT/spread.txt
done
for seed in 0 1 2; do
  PYTHONHASHSEED=$seed timeout 60 python3 bench/results/session-2026-11-24i/spread.py lenet-step 2>&1 | grep -v Warn | tail -1 | tee -a $OUT/spread.txt
done
for d in cuda opencl:0:0; do
  timeout 60 python3 -m portanet.cli profile mlp-small --batch-size 1000 --device $d 2>&1 \
    | grep -v Warn > $OUT/profile-mlp-small-${d//:/-}.txt; tail -18 $OUT/profile-mlp-small-${d//:/-}.txt
done
