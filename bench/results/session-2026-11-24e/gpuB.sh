# before (build/prev: 8b0d0e5, the session's start) and after, one call: the bf16 and fp16
# steps, then Fashion-MNIST in fp32 and fp16 (loss scaled) for 5 epochs
source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
W="--device cuda --workload mlp-big --workload mlp-small --precision bf16 --precision fp16"
(cd build/prev && PYTHONPATH=$PWD timeout 110 python3 -m portanet.cli bench $W --no-torch \
    --json $OUT/bench-before.json) 2>&1 | tail -8 | tee $OUT/bench.txt
timeout 150 python3 -m portanet.cli bench $W --json $OUT/bench-after.json 2>&1 | tail -10 \
    | tee -a $OUT/bench.txt
for m in mlp lenet; do for p in fp32 fp16; do
  timeout 80 python3 -m portanet.cli train --model $m --epochs 5 --device cuda --precision $p \
      --json 2>&1 | grep -E "^epoch|^\{"
done; done | tee $OUT/train.txt
