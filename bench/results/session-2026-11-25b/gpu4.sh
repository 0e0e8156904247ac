# session 25b, call 4: routes chosen alone against the fewest launches, whole steps timed
source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
D=bench/results/session-2026-11-25b
for round in 1 2; do
  for policy in routed fewest; do
    timeout 90 python3 $D/route_policy.py $policy mlp-small 1000 > $OUT/policy-$policy-mlp-$round.txt 2>&1
    tail -1 $OUT/policy-$policy-mlp-$round.txt
    timeout 90 python3 $D/route_policy.py $policy lenet-step 64 > $OUT/policy-$policy-lenet-$round.txt 2>&1
    tail -1 $OUT/policy-$policy-lenet-$round.txt
  done
done
cat $OUT/policy-fewest-mlp-1.txt $OUT/policy-fewest-lenet-1.txt
