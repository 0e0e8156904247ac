# session 25b, call 2: the enqueue's cost by its arguments, variants interleaved
source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
D=bench/results/session-2026-11-25b
timeout 200 python3 $D/enqueue_ab.py opencl:0:0 > $OUT/enqueue-ab.txt 2>&1; cat $OUT/enqueue-ab.txt
timeout 100 python3 $D/enqueue_ab.py opencl:0:0 > $OUT/enqueue-ab2.txt 2>&1; cat $OUT/enqueue-ab2.txt
