# session 27, call 4: call 3's profile had the backward convolutions slower reading 16-bit
# images and deltas. LeNet's second convolution on the implicit path, float32 against 16-bit
# operands in one process (conv16.py), then Nsight Compute on the dgrad launches.
source bench/gpu_setup.sh
ROOT=$PWD
S=$ROOT/bench/results/session-2026-11-27
cd /tmp
for p in bf16 fp16; do
  timeout 60 env PYTHONPATH=$ROOT:$PYTHONPATH python3 $S/conv16.py $p 2>&1 | tail -6
done
NCU=1 timeout 200 env PYTHONPATH=$ROOT:$PYTHONPATH ncu --kernel-name regex:gemm \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
  python3 $S/conv16.py bf16 > $OUT/ncu-bf16.txt 2>&1
echo "rc $?" >> $OUT/ncu-bf16.txt
grep -E "gemm|Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Memory Throughput|DRAM Throughput|L1/TEX Hit|L2 Hit|Compute \(SM\)|Block Size|Grid Size|Shared Memory Config|Dynamic Shared|Static Shared" $OUT/ncu-bf16.txt | head -120
