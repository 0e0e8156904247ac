# session 25b, call 5: NVIDIA OpenCL tuned for products of 768 and 512 (mlp-small's and
# LeNet's size), merged beside the shipped classes; mlp-small and lenet-step A/B
source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
D=bench/results/session-2026-11-25b
timeout 330 python3 -m portanet.cli tune --device opencl:0:0 --size 768 --size 512 \
  --output $OUT/tune-small.json --json $OUT/tune-small-all.json > $OUT/tune-small.txt 2>&1
tail -8 $OUT/tune-small.txt
rm -rf /tmp/after && mkdir /tmp/after && cp -r portanet kernels_cl kernels_cu /tmp/after/
python3 $D/merge_sizes.py /tmp/after/portanet/tuned.json $OUT/tune-small.json
cp /tmp/after/portanet/tuned.json $OUT/tuned-merged.json
for round in 1 2; do
  for tree in . /tmp/after; do
    name=$( [ $tree = . ] && echo before || echo after )
    (cd $tree && PYTHONPATH=$PWD:/tmp/site timeout 100 python3 -m portanet.cli bench \
      --device opencl:0:0 --workload mlp-small --workload lenet-step --no-torch) > $OUT/ab-$round-$name.txt 2>&1
    echo "round $round $name"; grep "fp32" $OUT/ab-$round-$name.txt | grep "auto" | cut -c1-90
  done
done
