# session 26, call 1: the spread between processes on NVIDIA's OpenCL against the GPU's
# clocks (nvidia-smi every 100 ms), kernels built anew (a fresh cache) or loaded from the
# cache, and the host's speed; cuda processes beside them
source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
D=bench/results/session-2026-11-26
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,pstate,utilization.gpu,temperature.gpu \
  --format=csv -lms 100 > $OUT/clocks.csv &
SMI=$!
W="mlp-small:1000 lenet-step:64"
timeout 120 python3 $D/spread_probe.py opencl:0:0 $W 2>&1 | tee -a $OUT/spread.txt
for i in 1 2 3 4 5 6; do
  if [ $((i % 2)) = 1 ]; then
    XDG_CACHE_HOME=/tmp/cold$i timeout 120 python3 $D/spread_probe.py opencl:0:0 $W 2>&1 | tee -a $OUT/spread.txt
  else
    timeout 120 python3 $D/spread_probe.py opencl:0:0 $W 2>&1 | tee -a $OUT/spread.txt
  fi
done
timeout 120 python3 $D/spread_probe.py cuda $W 2>&1 | tee -a $OUT/spread.txt
timeout 120 python3 $D/spread_probe.py opencl:0:0 $W 2>&1 | tee -a $OUT/spread.txt
timeout 120 python3 $D/spread_probe.py cuda $W 2>&1 | tee -a $OUT/spread.txt
kill $SMI
grep "pid" $OUT/spread.txt
