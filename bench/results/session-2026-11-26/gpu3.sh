# session 26, call 3: the LeNet epoch beside PyTorch (issue 11's third criterion) at this
# tree; the SASS of gemm.cu at routing's tilings of mlp-small's two large products on
# OpenCL (nvcc and cuobjdump on the GPU machine: the instruction mix of the inner loop)
source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
timeout 200 python3 bench/lenet_compare.py --devices cuda,opencl:0:0 --epochs 4 \
  --json $OUT/lenet-epoch.json > $OUT/lenet-epoch.txt 2>&1; tail -12 $OUT/lenet-epoch.txt
B="-DREAL=float -DREAL_IS_DOUBLE=0 -DBIAS_ACT=0 -DCONV=0 -DPAD=4 -DVW=4 -DDB=0 -DMIN_GROUPS=2 -DSPLIT_K=1"
for cfg in "nn128x64:-DTRANS_B=0 -DTSM=128 -DTSN=64 -DTSK=32 -DWPTM=8 -DWPTN=4 -DMICRO=1 -DSUBGROUP=0" \
           "nt128x128:-DTRANS_B=1 -DTSM=128 -DTSN=128 -DTSK=16 -DWPTM=8 -DWPTN=8 -DMICRO=2 -DSUBGROUP=0" \
           "nt64x64sg:-DTRANS_B=1 -DTSM=64 -DTSN=64 -DTSK=16 -DWPTM=8 -DWPTN=4 -DMICRO=2 -DSUBGROUP=32"; do
  n=${cfg%%:*}; o=${cfg#*:}
  nvcc -arch=sm_90 -cubin -O3 -Ikernels_cu $B $o -DTRANS_A=0 kernels_cu/gemm.cu -o /tmp/$n.cubin \
    && cuobjdump -sass /tmp/$n.cubin > $OUT/sass-$n.txt
  echo "$n: $(grep -c FFMA $OUT/sass-$n.txt) FFMA, $(grep -c 'LDS' $OUT/sass-$n.txt) LDS \
($(grep -c 'LDS.128' $OUT/sass-$n.txt) .128), $(grep -c 'STS' $OUT/sass-$n.txt) STS \
($(grep -c 'STS.128' $OUT/sass-$n.txt) .128), $(grep -c 'LDG' $OUT/sass-$n.txt) LDG, \
$(grep -c 'BAR' $OUT/sass-$n.txt) BAR"
done
