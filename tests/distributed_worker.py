"""One rank of a distributed test job (tests/test_distributed.py runs it under mpiexec, or
as torchrun and srun would, each process told its rank),
or, with --alone, the one-process run it is compared with: trains a model two epochs on
a Fashion-MNIST subset and writes its weights to OUT/<rank>.npz."""
import argparse

import numpy as np

import portanet as pn


def main():
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("out")
    p.add_argument("--samples", type=int, default=600)
    p.add_argument("--batch", type=int, default=50)
    p.add_argument("--optimizer", default="sgd")
    p.add_argument("--alone", action="store_true")
    p.add_argument("--balanced", action="store_true", help="rank r's rate is r + 1")
    p.add_argument("--seed-by-rank", action="store_true",
                   help="rank r builds its network with seed 3 + r (rank 0's goes to all)")
    p.add_argument("--samples-by-rank", action="store_true",
                   help="rank r trains on samples - r samples (a mistake: the job ends)")
    args = p.parse_args()
    rate = None
    if args.balanced:
        from mpi4py import MPI
        rate = MPI.COMM_WORLD.Get_rank() + 1.0
    group = None if args.alone else pn.distributed.init(balance=rate)
    rank = group.rank if group else 0
    (x, y), _ = pn.load_dataset("fashion-mnist")
    samples = args.samples - (rank if args.samples_by_rank else 0)
    x, y = x[:samples], y[:samples]
    seed = 3 + (rank if args.seed_by_rank else 0)
    if args.model == "mlp":
        net = pn.mlp((784,), hidden=(64,), seed=seed)
        x = x.reshape(len(x), -1)
    else:
        net = pn.from_description("conv(4, 3, relu) maxpool(2) flatten dense(10, softmax)",
                                  (1, 28, 28), seed=seed)
    opt = pn.SGD(0.05, 0.9) if args.optimizer == "sgd" else pn.Adam(0.002)
    history = net.fit(x, y, epochs=2, batch_size=args.batch, optimizer=opt, seed=5)
    np.savez(f"{args.out}/{rank}.npz", device=net.backend.name, loss=history["loss"],
             engine=group.engine if group else "alone", **net.get_weights(),
             peer_sum=group is not None and getattr(group.engine_, "peer", None) is not None)


if __name__ == "__main__":
    main()
