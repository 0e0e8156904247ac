#!/usr/bin/env bash
# A change measured on a GPU host in one call: `portanet bench` of the tree before the change
# and of this tree, alternating, so that both meet the same machine, clocks and driver.
# Carry build/prev, the tree before (git archive <commit> | tar -x -C build/prev), beside
# what gpu_setup.sh needs. Settings:
#   WORKLOADS   default "mlp-big mlp-small lenet-step lenet-infer"
#   DEVICES     default "cuda opencl:0:0"
#   PRECISIONS  default "fp32"
#   ROUNDS      default 2 (before, after, before, after)
#   TORCH=1     PyTorch's columns too (they do not depend on the tree)
#   TESTS       a pytest -k expression: those tests of this tree on cuda and NVIDIA's OpenCL
#               first (tests/test_kernels.py and tests/test_conv.py)
# Writes bench-before-N.json, bench-after-N.json and bench.txt (the rows, each marked with
# its tree and round) under $OUT.
#   bash bench/gpu_before_after.sh
source bench/gpu_setup.sh
if [ -n "$TESTS" ]; then
    timeout ${TEST_SECONDS:-240} python3 -m pytest -q tests/test_kernels.py tests/test_conv.py \
        -k "($TESTS) and (cuda or nvidia)" -p no:cacheprovider 2>&1 | tail -6 \
        | tee "$OUT/tests.txt"
fi
args=""
for d in ${DEVICES:-cuda opencl:0:0}; do args="$args --device $d"; done
for w in ${WORKLOADS:-mlp-big mlp-small lenet-step lenet-infer}; do args="$args --workload $w"; done
for p in ${PRECISIONS:-fp32}; do args="$args --precision $p"; done
[ "$TORCH" = 1 ] || args="$args --no-torch"
ROOT=$PWD
for r in $(seq 1 ${ROUNDS:-2}); do for v in before after; do
    tree=$([ $v = before ] && echo "$ROOT/build/prev" || echo "$ROOT")
    (cd "$tree" && PYTHONPATH=$tree:$PYTHONPATH timeout 280 python3 -m portanet.cli bench \
        $args --json "$OUT/bench-$v-$r.json" 2>&1 | grep -E "^(cuda|opencl)" \
        | sed "s/^/$v $r /") | tee -a "$OUT/bench.txt"
done; done
