# Sourced by bench/gpu_*.sh on a GPU host without a package index. Results go under $OUT.
# Carried in the checkout: .gpu (wheels of pycuda, pyopencl, nvmath-python and pyclblast with
# CLBlast, and gpu-env.sh, which installs them into /tmp/site and points the OpenCL loader at
# NVIDIA's driver), .whl (portanet's own dependencies' wheels: safetensors; pytest-xdist and
# execnet where tests run in parallel) and .data/fashion-mnist. Names the GPU and its driver.
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
source .gpu/gpu-env.sh > /dev/null || exit 1
python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site \
    .whl/safetensors*.whl || exit 1
export PYTHONUNBUFFERED=1 PORTANET_DATA=$PWD/.data PYTHONPATH=$PWD:$PYTHONPATH
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
