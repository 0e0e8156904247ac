#!/usr/bin/env bash
# Issue 11 on the GPU machine, one call: profiles of a LeNet step (batch 64, 256) on cuda and
# NVIDIA's OpenCL, before (a worktree of the commit before the change, in .old) and after,
# then `portanet bench` twice each, alternating, so that before and after share one run.
# Needs .gpu, .whl and .old carried; results in $OUT/issue11.tar.
set -o pipefail
OUT=${OUT:-/tmp/out}; R=/tmp/issue11; mkdir -p "$OUT" $R
source .gpu/gpu-env.sh > /dev/null || exit 1
python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .whl/*.whl || exit 1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
for v in before after; do
    dir=$([ $v = before ] && echo .old || echo .)
    for d in cuda opencl:0:0; do for b in 64 256; do
        n=$v-$(echo $d | tr ':' '-')-lenet-$b
        (cd $dir && PYTHONPATH=$PWD:$PYTHONPATH timeout 100 python3 -m portanet.cli profile \
            lenet-step --device $d --batch-size $b --json $R/$n.json > $R/$n.txt 2>&1)
        echo "$n: $(tail -1 $R/$n.txt)"
    done; done
done
for r in 1 2; do for v in before after; do
    dir=$([ $v = before ] && echo .old || echo .)
    (cd $dir && PYTHONPATH=$PWD:$PYTHONPATH timeout 150 python3 -m portanet.cli bench \
        --device cuda --device opencl:0:0 --workload mlp-small --workload lenet-step \
        --workload mlp-big ${BENCH_TORCH:---no-torch} --json $R/bench-$v-$r.json 2>/dev/null \
        | grep -E "^(cuda|opencl)" | sed "s/^/$v $r /")
done; done
tar -C $R -cf "$OUT/issue11.tar" .
