"""Your own data-parallel training loop with :mod:`riftco.distributed` (MPI, ZeRO).

Run it with one process per replica::

    mpiexec -n 2 python examples/data_parallel.py --zero 1

Every rank builds the same model (same seed) and draws the same global batches; each keeps its
rows, runs forward and backward on them, and the :class:`riftco.distributed.DistributedOptimizer`
averages the gradients over the ranks (ZeRO 1/2: each rank updates its shard of Adam's state) and
leaves the same weights on every rank (ZeRO 3: each rank keeps its parts of the weights, and the
model gathers a block only while it computes with it). Rank 0 prints. Without ``mpiexec`` it runs as one rank.
The stages do the same with ``data_parallel=True`` (``riftco pretrain --data-parallel``).
"""

from __future__ import annotations

import argparse

import riftco
from riftco.distributed import DistributedOptimizer


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--zero", type=int, choices=(0, 1, 2, 3), default=0, help="ZeRO stage")
    p.add_argument("--steps", type=int, default=20, help="optimizer steps")
    p.add_argument("--batch-size", type=int, default=8, help="global batch (rows)")
    args = p.parse_args()

    group = riftco.distributed.init()
    group.check_batch_size(args.batch_size)
    config = riftco.TransformerConfig(
        vocab_size=256, d_model=64, n_heads=4, n_layers=2, d_ff=172, max_seq_len=64, seed=0
    )
    model = riftco.DecoderOnlyTransformer(config)
    # A job whose ranks were started with other settings stops here, on every rank.
    group.check_same("their model configuration", config.to_dict())
    model.set_activation_checkpointing("block")
    optimizer = DistributedOptimizer(
        group,
        model.parameters(),
        lambda params: riftco.Adam(params, lr=3e-3),
        zero=args.zero,
        model=model,  # ZeRO 3 shards its parameters (the other stages do not need it)
    )
    corpus = riftco.data.default_corpus(max_bytes=1_000_000)
    sampler = riftco.BatchSampler(corpus.tokens, args.batch_size, 64, seed=0)
    for step in range(args.steps):
        rows = group.rows(sampler.next_batch())  # this rank's share of the global batch
        loss = model.loss(rows)
        optimizer.backward(loss)  # ZeRO 2/3 reduce gradient buckets during this pass
        optimizer.step()  # averaged gradients, the same update on every rank
        optimizer.zero_grad()
        # Each rank holds the same number of targets here: the global loss is the mean.
        (total,) = group.sum([loss.item()])
        if group.is_main and (step % 5 == 0 or step == args.steps - 1):
            print(f"step {step + 1}: loss {total / group.world_size:.4f}")
    stats = riftco.memory_stats()
    if group.is_main:
        print(
            f"{group.world_size} rank(s), ZeRO {args.zero}: optimizer state "
            f"{stats['optimizer_state']['current_bytes'] / 2**10:.0f} KiB, parameters "
            f"{stats['parameter']['current_bytes'] / 2**10:.0f} KiB on rank 0"
        )
    if optimizer.sharded is not None:
        optimizer.sharded.detach()  # the whole model again on every rank (collective)


if __name__ == "__main__":
    main()
