"""A stand-in for nvmath-python (tests/test_cuda_host.py): cuBLAS calls checked, not run."""
