"""A training run for tests/python/test_distributed.py, started alone or under ``mpiexec``.

``python distributed_worker.py CASE POLICY OUT ZEROS [BUCKET_BYTES|- [DEVICE]]`` runs CASE (``pretrain``: a fresh model on
byte text; ``lora``: LoRA post-training on examples whose answers differ in length, so ranks
hold different target counts) once per ZeRO stage in ZEROS (comma-separated; ``-`` runs the
single-process reference), each into ``OUT/z<stage>`` (``OUT/single``), and writes
``result.json`` there on rank 0: the losses, the validation loss, the peak bytes by category of
each rank, and the trained parameters (``params.npz``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

import riftco

BATCH = int(os.environ.get("RIFTCO_WORKER_BATCH", "4"))  # 6 for three ranks
VOCAB = int(os.environ.get("RIFTCO_WORKER_VOCAB", "256"))  # the examples' ids are below 256
# ZeRO-3's gather budget in bytes (unset: none).
GATHER_BUDGET = os.environ.get("RIFTCO_WORKER_GATHER_BUDGET")
SEQ = 16


def _model_config() -> riftco.TransformerConfig:
    return riftco.TransformerConfig(
        vocab_size=VOCAB, d_model=32, n_heads=4, n_kv_heads=2, n_layers=2, d_ff=64,
        max_seq_len=32, seed=3,
    )


def _examples() -> riftco.ExampleCorpus:
    rng = np.random.default_rng(7)
    pairs = []
    for i in range(64):
        n = SEQ + 1
        ids = rng.integers(0, 256, n)
        labels = ids.copy()
        prompt = int(rng.integers(2, n - 2)) if i % 3 else n - 3  # answers of 2..14 targets
        labels[:prompt] = riftco.IGNORE_INDEX
        pairs.append((ids, labels))
    return riftco.examples_from_pairs(pairs, "random examples")


def _run(
    case: str, policy: str, out: Path, zero: int | None
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The run's metadata and its trained parameters by name."""
    common: dict[str, Any] = dict(
        steps=4, batch_size=BATCH, seq_len=SEQ, lr=1e-2, warmup_steps=1, save_every=2,
        eval_batches=1, activation_checkpointing=policy, data_parallel=zero is not None,
        zero=zero or 0,
    )
    if zero is not None and len(sys.argv) > 5 and sys.argv[5] != "-":
        common["data_parallel_bucket_bytes"] = int(sys.argv[5])
    if zero == 3 and GATHER_BUDGET is not None:
        common["zero3_gather_budget"] = int(GATHER_BUDGET)
    if len(sys.argv) > 6:
        common["device"] = sys.argv[6]
    if case == "pretrain":
        corpus = riftco.data.default_corpus(max_bytes=100_000)
        metadata = riftco.run_pretraining(
            _model_config(), riftco.PretrainingConfig(**common), corpus, out,
            progress=False, plots=False, overwrite=True,
        )
        trained = riftco.load_model(out).named_parameters()
    else:
        model = riftco.DecoderOnlyTransformer(_model_config())
        cfg = riftco.PostTrainingConfig(fine_tuning_method="lora", lora_mlp=True, **common)
        metadata = riftco.run_post_training(
            model, cfg, _examples(), out, progress=False, plots=False, overwrite=True
        )
        trained = model.named_lora_parameters()
    return metadata, {n: p.numpy() for n, p in trained}


def main() -> None:
    case, policy, root = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    for stage in sys.argv[4].split(","):
        zero = None if stage == "-" else int(stage)
        out = root / ("single" if zero is None else f"z{zero}")
        metadata, params = _run(case, policy, out, zero)
        peaks = metadata["peak_memory_bytes"]
        rank = 0
        if zero is not None:
            group = riftco.distributed.init()
            rank = group.rank
            peaks_by_rank = group.all_gather(peaks)
        else:
            peaks_by_rank = [peaks]
        if rank == 0:
            np.savez(out / "params.npz", **params)  # type: ignore[arg-type]
            result = {
                "losses": metadata["losses"],
                "validation_loss_after": metadata["validation_loss_after"],
                "peaks": peaks_by_rank,
                "trainable_elements": int(sum(v.size for v in params.values())),
                "staging_peak_bytes": metadata.get("data_parallel", {}).get("staging_peak_bytes"),
                "sliced_tables": metadata.get("data_parallel", {}).get("sliced_tables"),
            }
            (out / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
