# session 25c, call 2: ncu on our GEMM's 500 x 1000 x 1000 NT product (cuda twin of gemm.cl)
# beside cuBLAS's: where each spends its cycles (stall reasons, issue, memory)
source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
D=bench/results/session-2026-11-25c
python3 $D/own_ncu.py                  # builds the kernels outside the profiler
timeout 400 ncu --set full --import-source no python3 $D/own_ncu.py > $OUT/ncu-own.txt 2>&1
grep -E "^  [a-zA-Z_].*\(|Duration|Registers Per|Achieved Occ|Theoretical Occ|Stall|Issue Slots Busy|Compute \(SM\) Throughput|Memory Throughput|Executed Ipc A|L1/TEX Hit|L2 Hit|Bank|Warp Cycles Per Issued|One or More|No Eligible|Active Warps Per|Eligible Warps" $OUT/ncu-own.txt | cut -c1-150 | head -150
