# Sourced by the bench/gpu_*.sh scripts on the GPU machine (device tool): results go under
# $OUT; pycuda, pyopencl and the rest come from the carried .gpu (../shared/device), and
# safetensors from the carried .whl; Fashion-MNIST is the carried .data; the GPU is named.
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
source .gpu/gpu-env.sh > /dev/null || exit 1
python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site \
    .whl/safetensors*.whl || exit 1
export PYTHONUNBUFFERED=1 PORTANET_DATA=$PWD/.data
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
