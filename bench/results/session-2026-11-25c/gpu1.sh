# session 25c, call 1: where the mlp-small step's device time goes on each API now, which
# kernels cuBLAS runs for its 500 x 1000 x 1000 products, and how fast our GEMM can run
# those two products over many tilings and splits (bench/mid_gemm.py)
source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
D=bench/results/session-2026-11-25c
for dev in opencl:0:0 cuda; do
  timeout 60 python3 -m portanet.cli profile mlp-small --batch-size 1000 --device $dev \
    > $OUT/profile-${dev//:/-}.txt 2>&1
  tail -22 $OUT/profile-${dev//:/-}.txt
done
timeout 120 ncu --section LaunchStats --section Occupancy --metrics gpu__time_duration.sum \
  python3 $D/vendor_ncu.py > $OUT/ncu-cublas.txt 2>&1
grep -E "^  [a-zA-Z_].*\(|Grid Size|Block Size|Registers Per|gpu__time_duration|Achieved Occ|Shared Memory Config|Dynamic Shared|Static Shared" $OUT/ncu-cublas.txt | head -60
timeout 200 python3 bench/mid_gemm.py opencl:0:0 500 1000 1000 NN --dense --seconds 140 > $OUT/sweep-nn.txt 2>&1
tail -18 $OUT/sweep-nn.txt
timeout 200 python3 bench/mid_gemm.py opencl:0:0 500 1000 1000 NT --seconds 140 --seed 1 > $OUT/sweep-nt.txt 2>&1
tail -18 $OUT/sweep-nt.txt
