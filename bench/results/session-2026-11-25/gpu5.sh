# session 25, call 5: mlp-big in each precision beside PyTorch (issue 18; call 4's ran out of
# time), then the training, optimizer and layer-gradient tests on cuda and NVIDIA's OpenCL
source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
timeout 280 python3 -m portanet.cli bench --device cuda --workload mlp-big --precision bf16 \
  --precision fp16 --precision tf32 --json $OUT/bench-precisions.json > $OUT/bench-precisions.txt 2>&1
grep -E "^cuda .*auto" $OUT/bench-precisions.txt | cut -c1-175
timeout 250 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_training.py tests/test_optimizers.py \
  tests/test_layer_gradients.py -k "cuda or nvidia" > $OUT/tests-training.txt 2>&1
tail -5 $OUT/tests-training.txt
