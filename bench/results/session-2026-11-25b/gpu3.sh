# session 25b, call 3: does where a process's threads run set NVIDIA's OpenCL enqueue cost
# (the spread between processes)? Topology, then processes under different affinities
source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
D=bench/results/session-2026-11-25b
(lscpu | head -25; nvidia-smi topo -m; cat /proc/cpuinfo | grep MHz | head -4) > $OUT/topology.txt 2>&1
cat $OUT/topology.txt
{
for round in 1 2; do
  for cpus in all 0 0,1 2,3 0-3 0-7 8-15; do
    if [ $cpus = all ]; then timeout 60 python3 $D/pinned.py unpinned 2>/dev/null
    else timeout 60 taskset -c $cpus python3 $D/pinned.py pinned 2>/dev/null; fi
  done
done
} > $OUT/pinned.txt
cat $OUT/pinned.txt
