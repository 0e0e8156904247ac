# session 25, call 1: routing's transposed copy (vendor_t) on mlp-big, A/B against 5b495f2
# (build/prev), the transpose kernel's rate, the GPU tests of the change
source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
D=bench/results/session-2026-11-25
timeout 60 python3 $D/tr.py cuda opencl:0:0 > $OUT/transpose.txt 2>&1; cat $OUT/transpose.txt
for round in 1 2; do
  for tree in build/prev .; do
    name=$( [ $tree = . ] && echo after || echo before )
    (cd $tree && PYTHONPATH=$PWD:/tmp/site timeout 120 python3 -m portanet.cli bench --device cuda \
      --device opencl:0:0 --workload mlp-big --no-torch) > $OUT/ab-$round-$name.txt 2>&1
    echo "round $round $name"; grep "mlp-big" $OUT/ab-$round-$name.txt | grep -v "^cuda \|^opencl" | cut -c1-110
  done
done
timeout 60 python3 -m portanet.cli profile mlp-big --device cuda --batch-size 10000 > $OUT/profile-mlp-big-fp32.txt 2>&1
head -30 $OUT/profile-mlp-big-fp32.txt
timeout 150 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_kernels.py tests/test_memory.py \
  -k "(cuda or nvidia) and (transpose or gemm or rout or dense or plan)" > $OUT/tests-transposed.txt 2>&1
tail -5 $OUT/tests-transposed.txt
