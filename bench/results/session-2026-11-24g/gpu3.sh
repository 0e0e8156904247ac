# the two fusions off and on inside one process; where the GPU sits (its CPUs and NUMA
# node), and the opencl epoch with the process held to a core of each node
source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
nvidia-smi topo -m 2>&1 | tee $OUT/topology.txt
lscpu | grep -i -E "numa|socket|model name" | tee -a $OUT/topology.txt
for dev in opencl:0:0 cuda; do
  timeout 150 python3 build/s15/inproc_ab.py $dev 2>&1 | grep -v Warn | tee -a $OUT/inproc-ab.txt
done
last=$(($(nproc) - 1))
for core in 0 $last; do
  echo "== taskset -c $core" | tee -a $OUT/pinned.txt
  taskset -c $core timeout 100 python3 bench/lenet_compare.py --devices opencl:0:0 --epochs 3 \
    --no-torch 2>&1 | grep -v Warn | tail -2 | tee -a $OUT/pinned.txt
done
