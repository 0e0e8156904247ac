# session 24j, call 2: the GPU tests of this session's changes (routing, kept operands,
# graphs), then one whole bench on cuda and NVIDIA's OpenCL (issue 11) and mlp-big in each
# precision beside PyTorch (issue 18)
source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
timeout 150 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_graphs.py tests/test_kernels.py \
  -k "(cuda or nvidia) and (graph or replay or rout or fastest)" > $OUT/tests-routing-graphs.txt 2>&1
tail -4 $OUT/tests-routing-graphs.txt
timeout 330 python3 -m portanet.cli bench --device cuda --device opencl:0:0 --json $OUT/bench.json \
  > $OUT/bench.txt 2> $OUT/bench-progress.txt
grep -E "^(cuda|opencl)" $OUT/bench.txt | grep -v " gemm " | cut -c1-175
timeout 200 python3 -m portanet.cli bench --device cuda --workload mlp-big --precision bf16 \
  --precision fp16 --precision tf32 --json $OUT/bench-precisions.json > $OUT/bench-precisions.txt 2>&1
grep -E "^cuda .*auto" $OUT/bench-precisions.txt | cut -c1-175
