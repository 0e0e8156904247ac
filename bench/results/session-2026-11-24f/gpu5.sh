# the LeNet epoch (60000 images) with fit's default against the set sent from the host,
# PyTorch eager beside; then the GPU tests of training, recorded steps and DLPack
source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
for mode in auto false; do
  timeout 150 python3 bench/lenet_compare.py --devices cuda,opencl:0:0 --epochs 4 \
     --data-on-device $mode --json $OUT/lenet-epoch-$mode.json 2>&1 | grep -v Warn \
     | tail -6 | tee -a $OUT/lenet-epoch.txt
done
timeout 330 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_graphs.py \
  tests/test_training.py tests/test_dlpack.py tests/test_resume.py -k "cuda or nvidia" 2>&1 \
  | tail -8 | tee $OUT/tests.txt
