/* groups.h: sums over a one-dimensional work-group through local memory, for the families
   whose work-groups add up a row (blas: gemv, activation_bias_grad; norm; loss:
   bias_softmax_xent_grad). Apart from prelude.h so that gemm's source, and with it the
   tuned parameters keyed by its digest (portanet/tuning.py), is not touched by them. */

/* The work-items of such a group: a power of two, set from the device's limits. */
#ifndef GROUP_THREADS
#define GROUP_THREADS 256
#endif

/* The sum of every work-item's v over a group of GROUP_THREADS, returned to all: pairwise
   through local memory (partial: GROUP_THREADS reals), in the same order on every device.
   The last barrier keeps the next call from writing partial before all have read it. */
DEVICE MAYBE_UNUSED real group_sum(LOCAL_PTR real* partial, const real v) {
    const int t = LOCAL_ID(0);
    partial[t] = v;
    BARRIER();
    for (int stride = GROUP_THREADS / 2; stride > 0; stride /= 2) {
        if (t < stride) partial[t] += partial[t + stride];
        BARRIER();
    }
    const real total = partial[0];
    BARRIER();
    return total;
}

/* y[at] <- alpha (the group's sum of its work-items' `sum`s) + beta y[at], written by
   work-item 0: a row group's gemv output or bias gradient */
DEVICE MAYBE_UNUSED void group_sum_into(LOCAL_PTR real* partial, const real sum, GLOBAL real* y,
                                        const int at, const real alpha, const real beta) {
    const real total = group_sum(partial, sum);
    if (LOCAL_ID(0) == 0) y[at] = alpha * total + (beta == (real)0 ? (real)0 : beta * y[at]);
}
