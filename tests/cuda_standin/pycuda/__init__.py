"""A stand-in for pycuda (tests/test_cuda_host.py): device memory is host memory, copies are
real, kernels are found by name in their source and checked at launch (argument count and
types, pointers inside live allocations, block and grid sizes) but not run."""
