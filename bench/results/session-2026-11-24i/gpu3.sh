# session 17, call 3: the training, graph and loss-scaling tests on cuda and NVIDIA's
# OpenCL at this session's kernels; the whole bench beside PyTorch for the record
source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
timeout 270 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_training.py tests/test_graphs.py \
  tests/test_loss_scaling.py tests/test_semantics.py -k "cuda or nvidia" 2>&1 | tail -8 | tee $OUT/tests-training.txt
timeout 300 python3 -m portanet.cli bench --device cuda --device opencl:0:0 --json $OUT/bench-final.json \
  2>&1 | grep -v Warn | tee $OUT/bench-final.txt | tail -30
