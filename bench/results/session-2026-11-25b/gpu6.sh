# session 25b, call 6: is the mlp-small gap NVIDIA's OpenCL or our GEMM? cuda's step with
# our kernels only (PORTANET_GEMM=own) beside auto, and cuda's routing times per shape
source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
D=bench/results/session-2026-11-25b
for round in 1 2; do
  for g in auto own; do
    PORTANET_GEMM=$g timeout 100 python3 -m portanet.cli bench --device cuda --device opencl:0:0 \
      --workload mlp-small --workload lenet-step --no-torch > $OUT/gemm-$g-$round.txt 2>&1
    echo "round $round PORTANET_GEMM=$g"; grep "fp32" $OUT/gemm-$g-$round.txt | grep "auto\|own " | cut -c1-90
  done
done
timeout 90 python3 $D/route_policy.py routed mlp-small 1000 cuda > $OUT/routes-cuda-mlp.txt 2>&1
cat $OUT/routes-cuda-mlp.txt | cut -c1-400
