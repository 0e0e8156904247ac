# session 25c, call 4: gemm.cl's slab stores without bank conflicts (runs along k in pairs of
# work-items, runs along i/j stored as vectors): the grid on mlp-small's big products with
# warp blocks (SUBGROUP 32), then the steps on the kernel before (build/gemm-before, carried)
# and after (build/gemm-before: kernels_cl/gemm.cl and kernels_cu/gemm.cu as at f384e9b)
source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
run() { name=$1; shift; timeout $(( ${S} + 60 )) python3 bench/mid_gemm.py opencl:0:0 "$@" --grid \
          --seconds $S > $OUT/grid2-$name.txt 2>&1; grep -A8 "fastest first" $OUT/grid2-$name.txt | cut -c1-150;
        grep "vendor " $OUT/grid2-$name.txt; }
S=100 run nt-big 500 1000 1000 NT
S=100 run nn-big 500 1000 1000 NN --dense
mkdir -p /tmp/after && cp kernels_cl/gemm.cl kernels_cu/gemm.cu /tmp/after/
for v in before after; do
  if [ $v = before ]; then cp build/gemm-before/gemm.cl kernels_cl/; cp build/gemm-before/gemm.cu kernels_cu/;
  else cp /tmp/after/gemm.cl kernels_cl/; cp /tmp/after/gemm.cu kernels_cu/; fi
  timeout 150 python3 -m portanet.cli bench --device cuda --device opencl:0:0 --workload mlp-small \
    --workload lenet-step --no-torch > $OUT/step-$v.txt 2>&1
  echo "== $v"; grep "fp32" $OUT/step-$v.txt | cut -c1-100
done
