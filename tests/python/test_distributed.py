"""Data-parallel training over MPI (riftco.distributed), two ranks on this machine.

Each run starts ``mpiexec -n 2`` (the MPICH wheel's, from the ``mpi`` extra) with one kernel
thread per rank. The reference is one process training on the whole global batch: the losses
and weights must agree within f32 reduction-order rounding (two ranks sum their halves of each
gradient, one process sums all rows inside its GEMMs), and the three ZeRO stages must agree
with each other bit for bit (the same sums, Adam applied element-wise to shards).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import riftco
from riftco.training.sharded import unit_of

HERE = Path(__file__).parent
WORKER = HERE / "distributed_worker.py"
BIN = Path(sys.executable).parent
MPIEXEC = shutil.which("mpiexec", path=str(BIN)) or shutil.which("mpiexec")


def _mpi_missing() -> str | None:
    try:
        __import__("mpi4py")
    except ImportError:
        return "mpi4py is not installed (pip install 'riftco[mpi]')"
    if MPIEXEC is None:
        return "no mpiexec on PATH or beside the interpreter"
    return None


needs_mpi = pytest.mark.skipif(_mpi_missing() is not None, reason=str(_mpi_missing()))


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, RIFTCO_NUM_THREADS="1", **extra)
    for key in [k for k in env if k.startswith(("PMI_", "OMPI_", "PMIX_"))]:
        del env[key]
    return env


def _mpiexec(
    args: list[str], timeout: float = 240, n: int = 2, **env: str
) -> subprocess.CompletedProcess[str]:
    assert MPIEXEC is not None
    return subprocess.run(
        [MPIEXEC, "-n", str(n), *args], capture_output=True, text=True, timeout=timeout,
        env=_env(**env),
    )


def _single_process(case: str, policy: str, out: Path, **env: str) -> None:
    """The reference: ``distributed_worker.py`` in one process, the whole batch, into ``out``."""
    single = subprocess.run(
        [sys.executable, str(WORKER), case, policy, str(out), "-"],
        capture_output=True, text=True, timeout=240, env=_env(**env),
    )
    assert single.returncode == 0, single.stderr


def _start_until_checkpoint(
    command: list[str], out: Path
) -> tuple[subprocess.Popen[str], list[int]]:
    """Starts ``mpiexec -n 2 command`` and waits for its first complete checkpoint in ``out``;
    returns the job and the pids of its two ranks."""
    assert MPIEXEC is not None
    job = subprocess.Popen(
        [MPIEXEC, "-n", "2", *command], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=_env(),
    )
    deadline = time.monotonic() + 120
    while not riftco.training_state.find_checkpoints(out):
        if job.poll() is not None or time.monotonic() > deadline:
            job.kill()
            raise AssertionError(f"no checkpoint within 120 s: {job.communicate()}")
        time.sleep(0.05)
    ranks = [int(p) for p in os.listdir("/proc") if p.isdigit() and _is_rank(int(p), str(out))]
    assert len(ranks) == 2, ranks
    return job, ranks


def _result(folder: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    result = json.loads((folder / "result.json").read_text())
    with np.load(folder / "params.npz") as f:
        params = {k: f[k] for k in f.files}
    return result, params


U = 2.0**-24
"""The f32 unit roundoff."""


def gamma(n: int) -> float:
    """Higham's γ_n = n·u / (1 − n·u): any order of a sum of n products, with or without fused
    multiply-adds, lies within γ_n·Σ|terms| of the exact sum (Higham 2002, §3.1)."""
    return n * U / (1 - n * U)


def reduction_order_bound() -> float:
    """The relative difference, normwise, between two f32 computations of the worker's loss or
    of one gradient element that do the same arithmetic in another order.

    One process multiplies all 64 token rows of the batch in each product; two ranks multiply
    32 each, so the products' row blocking (hence the order of each dot product: ``gemm``'s
    paths and k-blocks depend on the row count) differs, and each weight gradient's sum over
    the rows is split in two and added by the all-reduce. Each sum on the way contributes at
    most γ_n of its terms' magnitudes per computation, taken here at the result's scale (a sum
    that cancels is not bounded this way: see :func:`adam_bounds`): the head (256 terms per
    hidden-state element), per block the q/k/v/o, gate/up and down products (32, 32 and 64 terms)
    and attention over 16 positions, forward and backward, and the weight gradients' 64 rows;
    two computations' errors add."""
    per_block = 2 * (gamma(32) + gamma(64) + gamma(16)) * 2
    return 2 * (gamma(256) + 2 * per_block + gamma(64))


def adam_bounds(rho: float) -> tuple[float, float]:
    """Bounds on a trained weight's difference after the worker's 4 Adam steps (lr 1e-2, one
    warm-up step, β = (0.9, 0.999)) between two runs whose gradients differ by ``rho``
    relative: ``(conditioned, anywhere)``.

    Adam moves a weight by ``lr_t·u_t`` with ``u_t = m̂_t / (√v̂_t + ε)``. ``u`` is invariant to
    the gradients' scale, so a relative perturbation ``rho`` of every gradient moves it by at
    most ``2·rho·|u|`` for an element whose gradient sums do not cancel below their terms
    (``|u| <= B_t``, the Cauchy–Schwarz bound of ``m̂`` by ``√v̂``): ``conditioned`` sums that
    over the steps, and holds for every such element. Where a gradient is close to 0 compared
    with its terms, its rounding is not small relative to it, and near 0 Adam divides by the
    root of its square: ``u`` can take any value within ``±B_t`` (Kingma & Ba 2015, §2.1), so
    the only bound is ``anywhere``, twice the whole of the possible movement. The test asks
    the first bound of 99 % of the weights (the few whose gradients cancel fall in the last
    percent: 0.03 to 0.11 % sat above 1e-6 on AVX2, AVX-512 and scalar) and the second of all.
    """
    b1, b2, steps, lr, warmup = 0.9, 0.999, 4, 1e-2, 1
    conditioned = anywhere = 0.0
    for t in range(1, steps + 1):
        a = [(1 - b1) * b1 ** (t - s) / (1 - b1**t) for s in range(1, t + 1)]
        b = [(1 - b2) * b2 ** (t - s) / (1 - b2**t) for s in range(1, t + 1)]
        bound = math.sqrt(sum(ai * ai / bi for ai, bi in zip(a, b)))
        lr_t = lr * min(1.0, t / warmup)
        conditioned += lr_t * 2 * rho * bound
        anywhere += lr_t * 2 * bound
    return conditioned, anywhere


@needs_mpi
@pytest.mark.parametrize("case", ["pretrain", "lora"])
@pytest.mark.parametrize("policy", ["disabled", "block"])
def test_two_ranks_equal_one_process(case: str, policy: str, tmp_path: Path) -> None:
    _single_process(case, policy, tmp_path)
    ranks = _mpiexec([sys.executable, str(WORKER), case, policy, str(tmp_path), "0,1,2,3"])
    assert ranks.returncode == 0, ranks.stderr
    ref, ref_params = _result(tmp_path / "single")
    stage0, stage0_params = _result(tmp_path / "z0")
    # One process against two ranks: the same arithmetic in another order. See
    # reduction_order_bound for the argument; every level of the machine runs this test.
    rho = reduction_order_bound()
    np.testing.assert_allclose(stage0["losses"][0], ref["losses"][0], rtol=rho)
    np.testing.assert_allclose(stage0["losses"], ref["losses"], rtol=rho)
    assert math.isclose(stage0["validation_loss_after"], ref["validation_loss_after"], rel_tol=rho)
    assert stage0_params.keys() == ref_params.keys() and ref_params
    diff = np.concatenate(
        [np.abs(stage0_params[k] - v).ravel() for k, v in ref_params.items()]
    )
    conditioned, anywhere = adam_bounds(rho)
    assert np.quantile(diff, 0.99) <= conditioned, (np.quantile(diff, 0.99), conditioned)
    assert diff.max() <= anywhere, (diff.max(), anywhere)
    # Every ZeRO stage computes the same sums and the same element-wise Adam: bitwise equal
    # (ZeRO-3's gathers restore the stored bytes, so its forward reads the same values).
    for zero in (1, 2, 3):
        other, other_params = _result(tmp_path / f"z{zero}")
        assert other["losses"] == stage0["losses"], zero
        for name, value in stage0_params.items():
            np.testing.assert_array_equal(other_params[name], value, err_msg=f"zero {zero}")


@needs_mpi
@pytest.mark.parametrize("case", ["pretrain", "lora"])
def test_three_ranks_with_uneven_shards_equal_one_process(case: str, tmp_path: Path) -> None:
    """Three ranks cut every unit into parts whose last one is padded (no unit's size here is
    a multiple of 3): ZeRO-3 against one process within the bounds two ranks meet, and against
    ZeRO-2 on the same three ranks bit for bit. Both reduce-scatter each element as the sum
    of the same three values; MPICH picks its reduce-scatter algorithm by message size, and
    ZeRO-2's buckets are not ZeRO-3's units, so equality holds where the order of the three
    additions comes out the same (it does for every element of these runs; it is not
    guaranteed for other sizes or another MPI)."""
    _single_process(case, "block", tmp_path, RIFTCO_WORKER_BATCH="6")
    ranks = _mpiexec(
        [sys.executable, str(WORKER), case, "block", str(tmp_path), "2,3"], n=3,
        RIFTCO_WORKER_BATCH="6",
    )
    assert ranks.returncode == 0, ranks.stderr
    ref, ref_params = _result(tmp_path / "single")
    two, two_params = _result(tmp_path / "z2")
    three, three_params = _result(tmp_path / "z3")
    assert len(three["peaks"]) == 3
    rho = reduction_order_bound()
    np.testing.assert_allclose(three["losses"], ref["losses"], rtol=rho)
    diff = np.concatenate([np.abs(three_params[k] - v).ravel() for k, v in ref_params.items()])
    conditioned, anywhere = adam_bounds(rho)
    assert np.quantile(diff, 0.99) <= conditioned, (np.quantile(diff, 0.99), conditioned)
    assert diff.max() <= anywhere, (diff.max(), anywhere)
    assert three["losses"] == two["losses"]
    for name, value in two_params.items():
        np.testing.assert_array_equal(three_params[name], value, err_msg=name)


@needs_mpi
@pytest.mark.parametrize("n", [2, 3])
def test_zero3_gives_a_frozen_table_above_the_gather_budget_by_slices(
    n: int, tmp_path: Path
) -> None:
    """LoRA under a gather budget below the frozen embedding's and head's size (2048 x 32
    float32 rows: 256 KiB each, the blocks about 45 KiB): ZeRO-3 gives both to the model by
    slices of 128 rows (a quarter of 64 KiB), each gathered with an Iallgatherv of every rank's bytes
    of those rows (three ranks: slices that straddle the parts), and trains within the bounds
    two ranks meet against one process. It is not bitwise ZeRO-2: the loss's logsumexp is
    combined slice by slice (see riftco_kernels::linear_loss::sliced)."""
    env = {"RIFTCO_WORKER_VOCAB": "2048", "RIFTCO_WORKER_GATHER_BUDGET": str(64 * 1024)}
    if n == 3:
        env["RIFTCO_WORKER_BATCH"] = "6"
    ranks = _mpiexec(
        [sys.executable, str(WORKER), "lora", "block", str(tmp_path), "2,3"], 240, n, **env
    )
    assert ranks.returncode == 0, ranks.stderr
    two, two_params = _result(tmp_path / "z2")
    three, three_params = _result(tmp_path / "z3")
    assert three["sliced_tables"] == {"model.embed_tokens": 128, "lm_head": 128}
    assert two["sliced_tables"] is None
    rho = reduction_order_bound()
    np.testing.assert_allclose(three["losses"], two["losses"], rtol=rho)
    assert math.isclose(three["validation_loss_after"], two["validation_loss_after"], rel_tol=rho)
    diff = np.concatenate([np.abs(three_params[k] - v).ravel() for k, v in two_params.items()])
    conditioned, anywhere = adam_bounds(rho)
    assert np.quantile(diff, 0.99) <= conditioned, (np.quantile(diff, 0.99), conditioned)
    assert diff.max() <= anywhere, (diff.max(), anywhere)


@needs_mpi
def test_zero3_holds_a_third_of_the_states_plus_two_gathered_units(tmp_path: Path) -> None:
    """Per rank, the peak of the parameter, gradient and optimizer-state bytes under ZeRO-3 is
    at most 1/N of one process's plus two gathered units (and their gradients), and below
    ZeRO-2's."""
    _single_process("pretrain", "block", tmp_path, RIFTCO_WORKER_BATCH="6")
    ranks = _mpiexec(
        [sys.executable, str(WORKER), "pretrain", "block", str(tmp_path), "2,3"], n=3,
        RIFTCO_WORKER_BATCH="6",
    )
    assert ranks.returncode == 0, ranks.stderr
    ref, _ = _result(tmp_path / "single")
    two, _ = _result(tmp_path / "z2")
    three, _ = _result(tmp_path / "z3")
    states = ("parameter", "gradient", "optimizer_state")
    # The worker's model: its units' sizes in elements, the two largest.
    sys.path.insert(0, str(HERE))
    try:
        from distributed_worker import _model_config
    finally:
        sys.path.remove(str(HERE))
    sizes: dict[str, int] = {}
    for name, p in riftco.DecoderOnlyTransformer(_model_config()).named_parameters():
        unit = unit_of(name)
        assert unit is not None, name
        sizes[unit] = sizes.get(unit, 0) + math.prod(p.shape)
    largest_two = sum(sorted(sizes.values())[-2:])
    one_process = sum(ref["peaks"][0][k] for k in states)
    for rank_peaks in three["peaks"]:
        held = sum(rank_peaks[k] for k in states)
        # Parameter and gradient bytes of the two units, in float32.
        assert held <= one_process / 3 + 2 * 4 * largest_two, (held, one_process)
    for two_peaks, three_peaks in zip(two["peaks"], three["peaks"]):
        assert three_peaks["parameter"] < two_peaks["parameter"] / 1.5, (two_peaks, three_peaks)


@needs_mpi
@pytest.mark.parametrize("case", ["pretrain", "post-train"])
def test_a_zero3_run_resumed_from_its_shards_equals_one_run_straight_through(
    case: str, tmp_path: Path
) -> None:
    """ZeRO-3 resumes from each rank's parameter and optimizer parts (the consolidated model
    files of the checkpoint are not read): bitwise the same weights as a run without the stop;
    resuming with another number of ranks or stage is refused on every rank, exit 2, nothing
    written over the checkpoint."""
    base = tmp_path / "base"
    if case == "post-train":
        made = subprocess.run(
            _cli(out=base, steps=1), capture_output=True, text=True, timeout=120, env=_env()
        )
        assert made.returncode == 0, made.stderr
    extra = ["--zero", "3", "--save-every", "2"]

    def command(out: Path, steps: int, *more: str) -> list[str]:
        if case == "pretrain":
            return _cli(*extra, *more, out=out, steps=steps)
        return [
            str(BIN / "riftco"), "post-train", "--model", str(base), "--data-parallel",
            "--steps", str(steps), "--batch-size", "4", "--seq-len", "16", "--lora-rank", "4",
            "--lora-mlp", "--no-progress", "--no-plots", "--sample-tokens", "4", "--out",
            str(out), *extra, *more,
        ]

    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    done = _mpiexec(command(straight, 4), timeout=300)
    assert done.returncode == 0, done.stderr
    # The same run, then its last checkpoint and top-level files removed: it resumes from
    # the checkpoint of step 2.
    first = _mpiexec(command(stopped, 4), timeout=300)
    assert first.returncode == 0, first.stderr
    shutil.rmtree(stopped / "checkpoints" / "step-00000004")
    for leftover in ("model.safetensors", "config.json", "adapter"):
        target = stopped / leftover
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()
    before = {p: p.read_bytes() for p in (stopped / "checkpoints").rglob("*") if p.is_file()}
    # Another number of ranks (without consolidating the shards): refused by every rank, the
    # checkpoint untouched.
    other = _mpiexec(command(stopped, 4, "--resume"), timeout=300, n=4)
    assert other.returncode == 2, other.stderr
    assert "world_size: 2 in the checkpoint, 4 now" in other.stderr, other.stderr
    after = {p: p.read_bytes() for p in (stopped / "checkpoints").rglob("*") if p.is_file()}
    assert after == before
    # The two ranks' parameter shards swapped: the same error on every rank, exit 2.
    step2 = stopped / "checkpoints" / "step-00000002"
    a, b = (step2 / f"model.zero3-0000{r}-of-00002.safetensors" for r in (0, 1))
    a_bytes, b_bytes = a.read_bytes(), b.read_bytes()
    a.write_bytes(b_bytes)
    b.write_bytes(a_bytes)
    swapped = _mpiexec(command(stopped, 4, "--resume"), timeout=300)
    # (Ranks other than 0 print nothing: rank 0's line stands for all.)
    assert swapped.returncode == 2, swapped.stderr
    assert "Abort" not in swapped.stderr and "rank 0 of 2: " in swapped.stderr, swapped.stderr
    assert "another checkpoint, run or rank: rank: 1 against 0" in swapped.stderr
    a.write_bytes(a_bytes)
    b.write_bytes(b_bytes)
    resumed = _mpiexec(command(stopped, 4, "--resume"), timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming" in resumed.stderr
    a = json.loads((straight / "training_metadata.json").read_text())
    b = json.loads((stopped / "training_metadata.json").read_text())
    assert a["losses"] == b["losses"]
    name = "model.safetensors" if case == "pretrain" else "adapter/adapter_model.safetensors"
    assert (straight / name).read_bytes() == (stopped / name).read_bytes()


@needs_mpi
def test_two_ranks_on_the_gpu_equal_one_process_on_the_cpu(tmp_path: Path) -> None:
    entry = next(d for d in riftco.devices() if d["device"] == "gpu")
    if not entry["available"]:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and no GPU adapter (CI installs Mesa's): {entry['reason']}")
        pytest.skip(f"no GPU adapter ({entry['reason']}); set CI=true to make this a failure")
    _single_process("pretrain", "block", tmp_path)
    ranks = _mpiexec(
        [sys.executable, str(WORKER), "pretrain", "block", str(tmp_path), "2", "-", "gpu"]
    )
    assert ranks.returncode == 0, ranks.stderr
    ref, ref_params = _result(tmp_path / "single")
    gpu, gpu_params = _result(tmp_path / "z2")
    # The GPU's kernels do the same arithmetic in other orders (its own tiling of every sum):
    # the same bounds as two CPU ranks (measured on llvmpipe, 2026-12-05: losses within 1e-7
    # relative of the CPU's).
    rho = reduction_order_bound()
    np.testing.assert_allclose(gpu["losses"], ref["losses"], rtol=rho)
    diff = np.concatenate([np.abs(gpu_params[k] - v).ravel() for k, v in ref_params.items()])
    conditioned, anywhere = adam_bounds(rho)
    assert np.quantile(diff, 0.99) <= conditioned, (np.quantile(diff, 0.99), conditioned)
    assert diff.max() <= anywhere, (diff.max(), anywhere)


@needs_mpi
def test_zero_halves_the_optimizer_state_of_each_rank(tmp_path: Path) -> None:
    _single_process("lora", "disabled", tmp_path)
    ranks = _mpiexec([sys.executable, str(WORKER), "lora", "disabled", str(tmp_path), "0,1,2"])
    assert ranks.returncode == 0, ranks.stderr
    ref, _ = _result(tmp_path / "single")
    n = ref["trainable_elements"]
    # Adam's two f32 moments of every trainable element: 8 bytes each.
    assert ref["peaks"][0]["optimizer_state"] == 8 * n
    for zero in (0, 1, 2):
        result, _ = _result(tmp_path / f"z{zero}")
        for rank_peaks in result["peaks"]:
            # One bucket here (8192 elements < 25 MiB): each rank holds ceil(n / 2) elements.
            expected = 8 * n if zero == 0 else 8 * -(-n // 2)
            assert rank_peaks["optimizer_state"] == expected, (zero, rank_peaks)
            if zero:
                # The shard's own value: ceil(n / 2) more f32 parameter bytes than stage 0.
                stage0, _ = _result(tmp_path / "z0")
                extra = rank_peaks["parameter"] - stage0["peaks"][0]["parameter"]
                assert extra == 4 * -(-n // 2)


@needs_mpi
def test_zero2_never_holds_a_whole_gradient(tmp_path: Path) -> None:
    bucket = 16384
    _single_process("pretrain", "block", tmp_path)
    ranks = _mpiexec(
        [sys.executable, str(WORKER), "pretrain", "block", str(tmp_path), "1,2", str(bucket)]
    )
    assert ranks.returncode == 0, ranks.stderr
    ref, _ = _result(tmp_path / "single")
    stage1, _ = _result(tmp_path / "z1")
    stage2, _ = _result(tmp_path / "z2")
    p_bytes = 4 * ref["trainable_elements"]
    # One process: the parameters' gradients plus the pass's transient gradients of op nodes.
    transient = ref["peaks"][0]["gradient"] - p_bytes
    assert transient >= 0
    for rank_peaks in stage2["peaks"]:
        # This rank's half of every bucket, the transient ones, and at most one bucket being
        # completed (measured: 73,732 bytes against 148,096 for one process).
        assert rank_peaks["gradient"] <= p_bytes // 2 + transient + bucket, rank_peaks
    assert all(r["gradient"] > stage2["peaks"][0]["gradient"] for r in stage1["peaks"])
    # The buckets being filled live outside the native counters: at most two at once here.
    assert 0 < stage2["staging_peak_bytes"] <= 2 * bucket


def _cli(
    *extra: str, out: Path, steps: int = 4, seed: str = "0"
) -> list[str]:
    return [
        str(BIN / "riftco"), "pretrain", "--data-parallel", "--steps", str(steps),
        "--batch-size", "4", "--seq-len", "16", "--d-model", "16", "--n-heads", "2",
        "--n-layers", "1", "--d-ff", "32", "--max-seq-len", "32", "--no-progress", "--no-plots",
        "--sample-tokens", "4", "--seed", seed, "--out", str(out), *extra,
    ]


@needs_mpi
@pytest.mark.parametrize("zero", ["0", "3"])
def test_ranks_with_different_settings_all_exit_naming_the_difference(
    zero: str, tmp_path: Path
) -> None:
    assert MPIEXEC is not None
    out = tmp_path / "run"
    a, b = _cli("--zero", zero, out=out, seed="0"), _cli("--zero", zero, out=out, seed="1")
    proc = subprocess.run(
        [MPIEXEC, "-n", "1", *a, ":", "-n", "1", *b],
        capture_output=True, text=True, timeout=120, env=_env(),
    )
    assert proc.returncode == 2, proc.stderr
    assert "the ranks of this job differ" in proc.stderr
    assert "model_config.seed: 0 against 1" in proc.stderr, proc.stderr


# Long enough that the kill lands mid-run (a tiny model takes about 1 ms a step), short enough
# that the resumed run ends soon.
STEPS = 3000


@needs_mpi
@pytest.mark.parametrize("zero", ["2", "3"])
def test_a_killed_rank_ends_the_job_and_the_last_checkpoint_resumes(
    zero: str, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    command = _cli("--save-every", "5", "--zero", zero, out=out, steps=STEPS)
    job, victims = _start_until_checkpoint(command, out)
    try:
        os.kill(max(victims), signal.SIGKILL)
        started = time.monotonic()
        job.communicate(timeout=60)
        assert job.returncode != 0
        assert time.monotonic() - started < 60
    finally:
        if job.poll() is None:
            job.kill()
            job.communicate()
    # The newest complete checkpoint loads, and the run resumes from it to the end.
    newest = riftco.training_state.find_checkpoints(out)[-1]
    checkpoint = riftco.training_state.read_checkpoint(newest)
    assert checkpoint.state["optimizer_files"] == [
        "optimizer.zero-00000-of-00002.safetensors",
        "optimizer.zero-00001-of-00002.safetensors",
    ] + (
        # ZeRO-3: each rank's parameter parts.
        ["model.zero3-00000-of-00002.safetensors", "model.zero3-00001-of-00002.safetensors"]
        if zero == "3"
        else []
    )
    resumed = _mpiexec([*_cli("--zero", zero, "--resume", out=out, steps=STEPS)], timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming pretraining at step {checkpoint.step}/{STEPS}" in resumed.stderr
    metadata = json.loads((out / "training_metadata.json").read_text())
    assert metadata["complete"] and len(metadata["losses"]) == STEPS


@needs_mpi
@pytest.mark.parametrize("zero", ["0", "3"])
def test_a_rank_that_hangs_makes_the_other_abort_after_the_timeout(
    zero: str, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    command = _cli(
        "--data-parallel-timeout", "3", "--save-every", "5", "--zero", zero, out=out,
        steps=200_000,
    )
    job, ranks = _start_until_checkpoint(command, out)
    stopped: list[int] = []
    try:
        os.kill(max(ranks), signal.SIGSTOP)  # alive, but never reaches the next collective
        stopped.append(max(ranks))
        started = time.monotonic()
        _, stderr = job.communicate(timeout=90)
        waited = time.monotonic() - started
    finally:
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if job.poll() is None:
            job.kill()
            job.communicate()
    assert job.returncode != 0
    assert "waited more than 3 s in" in stderr, stderr
    assert 3 <= waited < 90


@needs_mpi
def test_the_example_loop_trains_alike_on_one_and_two_ranks() -> None:
    example = HERE.parent.parent / "examples" / "data_parallel.py"
    alone = subprocess.run(
        [sys.executable, str(example), "--steps", "6"], capture_output=True, text=True,
        timeout=240, env=_env(),
    )
    assert alone.returncode == 0, alone.stderr
    two = _mpiexec([sys.executable, str(example), "--steps", "6", "--zero", "2"])
    assert two.returncode == 0, two.stderr
    three = _mpiexec([sys.executable, str(example), "--steps", "6", "--zero", "3"])
    assert three.returncode == 0, three.stderr
    lines = [ln for ln in two.stdout.splitlines() if ln.startswith("step ")]
    assert lines == [ln for ln in alone.stdout.splitlines() if ln.startswith("step ")]
    assert lines == [ln for ln in three.stdout.splitlines() if ln.startswith("step ")]
    assert len(lines) == 2  # steps 1 and 6, equal to 4 decimals

    def kib(out: str, what: str) -> int:
        found = re.search(rf"{what} (\d+) KiB", out)
        assert found, out
        return int(found.group(1))

    # ZeRO 2 halves Adam's state; ZeRO 3 the parameters too (between steps, nothing gathered).
    assert abs(kib(two.stdout, "optimizer state") - kib(alone.stdout, "optimizer state") / 2) <= 1
    assert abs(kib(three.stdout, "parameters") - kib(alone.stdout, "parameters") / 2) <= 1


def _is_rank(pid: int, marker: str) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    words = [w.decode(errors="replace") for w in cmdline]
    return marker in words and not any("mpiexec" in w or "hydra" in w for w in words[:1])


def test_data_parallel_without_mpi4py_says_what_to_install(tmp_path: Path) -> None:
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "mpi4py.py").write_text("raise ImportError('No module named mpi4py (test)')\n")
    env = dict(_env(), PYTHONPATH=os.pathsep.join([str(fake), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [str(BIN / "riftco"), *_cli(out=tmp_path / "run")[1:]],
        capture_output=True, text=True, timeout=120, env=env,
    )
    assert proc.returncode == 2
    assert "pip install 'riftco[mpi]'" in proc.stderr, proc.stderr
    assert not (tmp_path / "run").exists()


@needs_mpi
def test_a_unit_above_the_gather_budget_stops_every_rank(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = _mpiexec(_cli("--zero", "3", "--zero3-gather-budget", "1KiB", out=out))
    assert proc.returncode == 2, proc.stderr
    assert "unit model.embed_tokens gathers" in proc.stderr, proc.stderr
    assert "above the gather budget of 0.0 MiB (1024 bytes)" in proc.stderr
    assert "Abort" not in proc.stderr
    assert not riftco.training_state.find_checkpoints(out)


@pytest.mark.parametrize("zero", ["1", "3"])
def test_zero_without_data_parallel_is_a_usage_error(zero: str, tmp_path: Path) -> None:
    command = [c for c in _cli("--zero", zero, out=tmp_path / "run") if c != "--data-parallel"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=120, env=_env())
    assert proc.returncode == 2
    assert f"--zero {zero} shards over data-parallel ranks: it needs --data-parallel" in (
        proc.stderr
    )
    assert not (tmp_path / "run").exists()


@needs_mpi
def test_without_a_launcher_the_run_is_one_rank_and_says_so(tmp_path: Path) -> None:
    proc = subprocess.run(
        _cli(out=tmp_path / "run", steps=2), capture_output=True, text=True, timeout=120,
        env=_env(),
    )
    assert proc.returncode == 0, proc.stderr
    assert "not started by an MPI launcher (mpiexec/mpirun/srun): 1 rank" in proc.stderr


def test_config_checks() -> None:
    with pytest.raises(riftco.ConfigError, match="zero=1 shards the optimizer"):
        riftco.PretrainingConfig(zero=1)
    with pytest.raises(riftco.ConfigError, match="zero must be 0, 1, 2 or 3"):
        riftco.PretrainingConfig(data_parallel=True, zero=4)
    with pytest.raises(riftco.ConfigError, match="data_parallel must be True or False"):
        riftco.PretrainingConfig(data_parallel=1)  # type: ignore[arg-type]
    with pytest.raises(riftco.ConfigError, match="data_parallel_timeout_s"):
        riftco.PretrainingConfig(data_parallel=True, data_parallel_timeout_s=0.0)


def test_loss_weights_make_the_mean_over_the_global_batch() -> None:
    # Rank means L_r over T_r targets; the global mean is sum(L_r T_r) / T.
    counts, means = [3, 9], [2.0, 4.0]
    total = sum(counts)
    weights = [riftco.distributed.loss_weight(c, total, 2) for c in counts]
    averaged = sum(w * m for w, m in zip(weights, means)) / 2
    assert math.isclose(averaged, (3 * 2.0 + 9 * 4.0) / 12)
    labels = np.full((2, 5), riftco.IGNORE_INDEX)
    labels[0, 2:] = 1
    labels[1, 0] = 1  # the first column is never a target (shifted labels)
    assert riftco.distributed.target_count((np.zeros((2, 5)), labels)) == 3
    assert riftco.distributed.target_count(np.zeros((4, 17), np.int64)) == 64


def test_an_abort_message_waits_until_the_launcher_has_read_it() -> None:
    """Hydra can act on MPI_Abort before its proxy has read the rank's last stderr line; the
    abort waits (boundedly) for the pipe to drain so the message reaches the user."""
    read_fd, write_fd = os.pipe()
    with os.fdopen(write_fd, "w") as writer, os.fdopen(read_fd, "rb", buffering=0) as reader:
        writer.write("riftco: error: why\n")
        writer.flush()
        started = time.monotonic()
        riftco.distributed._wait_until_read(writer, limit_s=0.3)  # nobody reads: the limit
        assert time.monotonic() - started >= 0.3
        threading.Timer(0.1, reader.read, args=(19,)).start()
        started = time.monotonic()
        riftco.distributed._wait_until_read(writer, limit_s=30)  # returns once it is read
        assert time.monotonic() - started < 10
    with open(os.devnull, "w") as plain:  # not a pipe or socket: at once
        started = time.monotonic()
        riftco.distributed._wait_until_read(plain, limit_s=30)
        assert time.monotonic() - started < 10
