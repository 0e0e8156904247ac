# session 26, call 2: replayed launches with their arguments converted once (A/B in one
# process, alternating); the replay tests on cuda and NVIDIA's OpenCL; the whole bench and
# the LeNet epoch beside PyTorch at this tree
source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
D=bench/results/session-2026-11-26
timeout 150 python3 $D/enqueue_ab.py opencl:0:0 mlp-small:1000 lenet-step:64 lenet-step:256 \
  2>&1 | tee $OUT/enqueue-ab.txt
timeout 150 python3 -m pytest tests/test_graphs.py -q -p no:cacheprovider -k "cuda or nvidia" \
  > $OUT/tests-graphs.txt 2>&1; tail -3 $OUT/tests-graphs.txt
timeout 240 python3 -m portanet.cli bench --device cuda --device opencl:0:0 \
  --json $OUT/bench.json > $OUT/bench.txt 2>&1; grep -v "^  " $OUT/bench.txt | tail -22
timeout 150 python3 bench/lenet_compare.py --devices cuda,opencl:0:0 --epochs 4 \
  --json $OUT/lenet-epoch.json > $OUT/lenet-epoch.txt 2>&1; tail -8 $OUT/lenet-epoch.txt
