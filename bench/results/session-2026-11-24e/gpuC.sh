# before (build/prev: 8b0d0e5) and after, alternating, in one call: the bf16 and fp16 steps
source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
W="--device cuda --workload mlp-big --workload mlp-small --precision bf16 --precision fp16 --no-torch"
for round in 1 2; do
  (cd build/prev && PYTHONPATH=$PWD:$PYTHONPATH timeout 100 python3 -m portanet.cli bench $W \
      --json $OUT/bench-before-$round.json) 2>&1 | tail -6 | sed "s/^/before $round: /" \
      | tee -a $OUT/bench-ab.txt
  timeout 100 python3 -m portanet.cli bench $W --json $OUT/bench-after-$round.json 2>&1 \
      | tail -6 | sed "s/^/after $round: /" | tee -a $OUT/bench-ab.txt
done
timeout 60 python3 -m portanet.cli profile mlp-big --batch-size 10000 --precision bf16 \
    --device cuda 2>&1 | tail -40 > $OUT/profile-mlp-big-bf16.txt
