#!/usr/bin/env bash
# Issue 15 on the GPU machine (device tool). Carry .gpu (../shared/device), .whl (the
# safetensors wheel), .data (Fashion-MNIST) and build/old (the tree before the change:
# git archive 28d6ea7 | tar -x -C build/old). One part per call:
#   bash bench/gpu_issue15.sh compare   the conv tests on cuda and opencl:nvidia; then before
#                                       and after, alternating in this one call: portanet
#                                       bench lenet-infer and lenet-step (cuda, opencl:0:0,
#                                       PyTorch eager and CUDA-graph columns), the Fashion-
#                                       MNIST LeNet epoch (bench/lenet_compare.py); profiles
#                                       of a LeNet step after; each conv path's time per shape
#   bash bench/gpu_issue15.sh suite     the test suite on the GPUs
#   bash bench/gpu_issue15.sh pipeline  the input pipeline (batches laid out on the device,
#                                       background copies): its tests on cuda and
#                                       opencl:nvidia; portanet bench before and after,
#                                       alternating, twice (lenet-infer, lenet-step,
#                                       mlp-small)
#   bash bench/gpu_issue15.sh infer     lenet-infer before and after, twice, alternating;
#                                       five seeds' accuracy on build/pre15 (the tree
#                                       before issue 15: git archive 28d6ea7) and after;
#                                       bench/infer_profile.py on cuda
#   bash bench/gpu_issue15.sh final     the LeNet epoch (bench/lenet_compare.py) on build/pre15,
#                                       build/prev (the commit before the last change) and
#                                       after; five seeds' accuracy on build/pre15 and after
#   bash bench/gpu_issue15.sh accuracy  before and after: the LeNet epoch
#                                       (bench/lenet_compare.py) and five seeds' accuracy
#                                       (bench/seed_spread.py); profiles of a LeNet step
# Results under $OUT.
source bench/gpu_setup.sh
tree() { [ $1 = before ] && echo build/old || echo .; }
case "$1" in
compare)
    PYTHONPATH=$PWD:$PYTHONPATH timeout 150 python3 -m pytest -q -x tests/test_conv.py \
        -k "cuda or nvidia" -p no:cacheprovider 2>&1 | tail -4 | tee "$OUT/conv-tests.log"
    for r in 1 2; do for v in before after; do
        (cd $(tree $v) && PYTHONPATH=$PWD:$PYTHONPATH timeout 120 python3 -m portanet.cli \
            bench --device cuda --device opencl:0:0 --workload lenet-infer \
            --workload lenet-step --json /tmp/bench-$v-$r.json 2>&1 | grep -v Warning \
            | grep -E "^(cuda|opencl)" | sed "s/^/$v $r /") | tee -a "$OUT/bench.log"
    done; done
    for v in before after; do
        (cd $(tree $v) && PYTHONPATH=$PWD:$PYTHONPATH timeout 100 python3 \
            bench/lenet_compare.py --devices cuda,opencl:0:0 --epochs 2 \
            --json /tmp/epoch-$v.json 2>&1 | grep -v Warning | tail -5 | sed "s/^/$v /") \
            | tee -a "$OUT/epoch.log"
    done
    for d in cuda opencl:0:0; do for b in 64 256; do
        PYTHONPATH=$PWD:$PYTHONPATH timeout 60 python3 -m portanet.cli profile lenet-step \
            --device $d --batch-size $b 2>&1 | grep -v Warning > /tmp/profile-${d%%:*}-$b.txt
    done; done
    PYTHONPATH=$PWD:$PYTHONPATH timeout 100 python3 bench/conv_paths.py 2>&1 \
        | grep -v Warning | tee "$OUT/conv-paths.log"
    tar -C /tmp -cf "$OUT/issue15.tar" bench-before-1.json bench-after-1.json \
        bench-before-2.json bench-after-2.json epoch-before.json epoch-after.json \
        profile-cuda-64.txt profile-cuda-256.txt profile-opencl-64.txt profile-opencl-256.txt ;;
pipeline)
    PYTHONPATH=$PWD:$PYTHONPATH timeout 200 python3 -m pytest -q tests/test_kernels.py \
        tests/test_memory.py tests/test_graphs.py tests/test_training.py tests/test_threads.py \
        -k "cuda or nvidia" -p no:cacheprovider 2>&1 | tail -6 | tee "$OUT/pipeline-tests.log"
    for r in 1 2; do for v in before after; do
        (cd $(tree $v) && PYTHONPATH=$PWD:$PYTHONPATH timeout 150 python3 -m portanet.cli \
            bench --device cuda --device opencl:0:0 --workload lenet-infer \
            --workload lenet-step --workload mlp-small --json "$OUT/bench-$v-$r.json" 2>&1 \
            | grep -v Warning | grep -E "^(cuda|opencl|torch)" | sed "s/^/$v $r /") \
            | tee -a "$OUT/bench.log"
    done; done ;;
accuracy)
    for v in before after; do
        (cd $(tree $v) && PYTHONPATH=$PWD:$PYTHONPATH timeout 100 python3 \
            bench/lenet_compare.py --devices cuda,opencl:0:0 --epochs 2 \
            --json "$OUT/epoch-$v.json" 2>&1 | grep -v Warning | tail -5 | sed "s/^/$v /") \
            | tee -a "$OUT/epoch.log"
        PYTHONPATH=$(tree $v):$PYTHONPATH timeout 150 python3 bench/seed_spread.py \
            --json "$OUT/seeds-$v.json" 2>&1 | grep -v Warning | sed "s/^/$v /" \
            | tee -a "$OUT/seeds.log"
    done
    for v in before after; do for d in cuda opencl:0:0; do
        (cd $(tree $v) && PYTHONPATH=$PWD:$PYTHONPATH timeout 60 python3 -m portanet.cli \
            profile lenet-step --device $d --batch-size 64 2>&1 | grep -v Warning \
            > "$OUT/profile-$v-${d%%:*}-64.txt")
    done; done ;;
infer)
    for r in 1 2; do for v in before after; do
        (cd $(tree $v) && PYTHONPATH=$PWD:$PYTHONPATH timeout 100 python3 -m portanet.cli \
            bench --device cuda --device opencl:0:0 --workload lenet-infer \
            --json "$OUT/infer-$v-$r.json" 2>&1 | grep -v Warning | grep auto \
            | sed "s/^/$v $r /") | tee -a "$OUT/infer.log"
    done; done
    for v in build/pre15 .; do
        PYTHONPATH=$v:$PYTHONPATH timeout 150 python3 bench/seed_spread.py 2>&1 \
            | grep -v Warning | sed "s|^|$v |" | tee -a "$OUT/seeds.log"
    done
    PYTHONPATH=$PWD:$PYTHONPATH timeout 60 python3 bench/infer_profile.py --device cuda \
        2>&1 | grep -v Warning > "$OUT/infer-profile-cuda.txt" ;;
final)
    for v in pre15 prev after; do
        (cd $([ $v = after ] && echo . || echo build/$v) && PYTHONPATH=$PWD:$PYTHONPATH \
            timeout 100 python3 bench/lenet_compare.py --devices cuda,opencl:0:0 --epochs 2 \
            --json "$OUT/epoch-$v.json" 2>&1 | grep -v Warning | tail -4 | sed "s/^/$v /") \
            | tee -a "$OUT/epoch.log"
    done
    for v in build/pre15 .; do
        PYTHONPATH=$v:$PYTHONPATH timeout 150 python3 bench/seed_spread.py 2>&1 \
            | grep -v Warning | sed "s|^|$v |" | tee -a "$OUT/seeds.log"
    done ;;
suite)
    PYTHONPATH=$PWD:$PYTHONPATH timeout 560 python3 -m pytest -q tests -p no:cacheprovider \
        2>&1 | tail -25 | tee "$OUT/pytest.log" ;;
esac
