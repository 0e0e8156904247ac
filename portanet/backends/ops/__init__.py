"""The backend's op families, one module each: the family's interface (its methods'
contracts, as `Backend` declares them), its NumPy reference and its kernel launches, side
by side. `Backend` is the runtime core plus the interfaces, `NumpyBackend` the references
composed, `KernelBackend` the kernel launches composed (as mixins: no frame between a
call and its launch).

    blas         fill, copy, transpose, axpy, scal, gather, gather_batch
    activations  bias_activation, activation_grad, add_activation, dropout
    loss         softmax_xent, bias_softmax_xent(_grad), sigmoid_bce, mse, argmax
    pool         maxpool, avgpool and their gradients
    norm         batchnorm_train, batchnorm_infer, batchnorm_grad, layernorm(_grad)
    embed        embedding, embedding_grad
    attention    attention, attention_grad (fused, online softmax)
    optim        the optimizers' updates and dynamic loss scaling

The products (gemm, gemv, ger, dense, activation_bias_grad) and convolutions are
routed among paths: backends/gemm and backends/conv. Modules here import only the
backend's leaves (arrays, checks, errors, precision, rng), never a runtime."""
