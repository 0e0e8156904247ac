# session 25, call 4: one whole bench on cuda and NVIDIA's OpenCL beside PyTorch (issue 11),
# mlp-big in each precision beside PyTorch (issue 18), then the GPU tests of the routing,
# kernels and graphs this session touched
source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
timeout 330 python3 -m portanet.cli bench --device cuda --device opencl:0:0 --json $OUT/bench.json \
  > $OUT/bench.txt 2> $OUT/bench-progress.txt
grep -E "^(cuda|opencl)" $OUT/bench.txt | grep -v " gemm " | cut -c1-175
timeout 120 python3 -m portanet.cli bench --device cuda --workload mlp-big --precision bf16 \
  --precision fp16 --precision tf32 --json $OUT/bench-precisions.json > $OUT/bench-precisions.txt 2>&1
grep -E "^cuda .*auto" $OUT/bench-precisions.txt | cut -c1-175
timeout 140 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_kernels.py tests/test_graphs.py \
  -k "(cuda or nvidia) and (transpose or auto_gemm or activation_bias or bias_activation or graph or replay)" \
  > $OUT/tests-kernels-graphs.txt 2>&1
tail -4 $OUT/tests-kernels-graphs.txt
