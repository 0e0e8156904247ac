#!/usr/bin/env bash
# A change to the training step's kernels, measured on the GPU machine in one call. Carry
# .gpu (../shared/device), the safetensors wheel in .whl, .data and build/prev (the tree
# before the change: git archive <commit> | tar -x -C build/prev). In order:
#   - the kernel tests named by TESTS (a pytest -k expression) on cuda and opencl:nvidia;
#   - `portanet bench` of WORKLOADS (default lenet-step mlp-small) before and after,
#     alternating, twice, with PyTorch's eager and CUDA-graph columns;
#   - after: bench/step_launches.py on opencl:0:0 (each replayed launch alone) and Nsight
#     Compute's kernel durations of one eager cuda step, for LeNet at batch 64 and 256.
# Results under $OUT.
source bench/gpu_setup.sh
if [ -n "$TESTS" ]; then
    PYTHONPATH=$PWD:$PYTHONPATH timeout ${TEST_SECONDS:-240} python3 -m pytest -q \
        tests/test_kernels.py tests/test_conv.py -k "($TESTS) and (cuda or nvidia)" \
        -p no:cacheprovider 2>&1 | tail -6 | tee "$OUT/tests.log"
fi
work=""; for w in ${WORKLOADS:-lenet-step mlp-small}; do work="$work --workload $w"; done
for r in 1 2; do for v in before after; do
    (cd $([ $v = before ] && echo build/prev || echo .) && PYTHONPATH=$PWD:$PYTHONPATH \
        timeout 150 python3 -m portanet.cli bench --device cuda --device opencl:0:0 $work \
        --json "$OUT/bench-$v-$r.json" 2>&1 | grep -E "^(cuda|opencl).* auto " \
        | sed "s/^/$v $r /") | tee -a "$OUT/bench.log"
done; done
export PYTHONPATH=$PWD:$PYTHONPATH
for b in 64 256; do
    timeout 60 python3 bench/step_launches.py --device opencl:0:0 --batch $b 2>&1 \
        | grep -v -i warn >> "$OUT/launches.txt"
    timeout 90 ncu --profile-from-start off --metrics gpu__time_duration.sum --csv \
        python3 bench/step_launches.py --device cuda --batch $b 2>/dev/null \
        | grep '^"[0-9]' | awk -F'","' -v b=$b '{printf "%3d %-4s %-40.40s %s ns\n", \
        substr($1, 2), b, $5, $15}' >> "$OUT/ncu-cuda.txt"
done
cat "$OUT/launches.txt" "$OUT/ncu-cuda.txt"
