# session 25c, call 3: ncu says cuBLAS's 64 x 64 kernel beats ours by occupancy (3 groups an SM
# from a split K in 3, against our 2), at the same cycles per instruction: our kernel over a
# grid of tiles near cuBLAS's and splits of K, on mlp-small's products (NVIDIA's OpenCL)
source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
run() { name=$1; shift; timeout $(( ${S} + 60 )) python3 bench/mid_gemm.py opencl:0:0 "$@" --grid \
          --seconds $S > $OUT/grid-$name.txt 2>&1; grep -A8 "fastest first" $OUT/grid-$name.txt | cut -c1-150;
        grep "vendor " $OUT/grid-$name.txt; }
S=100 run nn-big 500 1000 1000 NN --dense
S=100 run nt-big 500 1000 1000 NT
S=50 run nn-mid 100 1000 500 NN --dense
S=50 run nt-mid 100 500 1000 NT
S=50 run tn-mid 500 1000 100 TN
