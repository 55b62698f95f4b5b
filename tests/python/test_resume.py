"""Training-state checkpoints and exact resume (``resume=True``, ``riftco ... --resume``): runs
killed with SIGKILL and resumed end bitwise equal to one uninterrupted run; settings that change
the math are refused on resume; broken checkpoints are ``ModelStateError`` naming the file; a
checkpoint that cannot be written leaves the previous one loadable."""

from __future__ import annotations

import errno
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import riftco
from riftco.training import state as training_state

REPO = Path(__file__).resolve().parents[2]


def _kill_script() -> Any:
    spec = importlib.util.spec_from_file_location("kill_resume", REPO / "scripts/kill_resume.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def kill_work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("kills")
    _kill_script().prepare_base(work)
    return work


@pytest.mark.parametrize(("case", "kills"), [("pretrain", 5), ("lora", 3)])
def test_killed_and_resumed_runs_equal_one_uninterrupted_run_bitwise(
    kill_work: Path, case: str, kills: int
) -> None:
    # The smaller version of scripts/kill_resume.py (30 kills per case): SIGKILL at random
    # moments (during steps, validation passes and saves), each restart resuming with another
    # checkpointing policy; dropout is on in both cases.
    result = _kill_script().run_case(case, kills, kill_work, seed=1, steps=40)
    assert result["kills"] == kills, result
    assert result["weights_bitwise_equal"], result
    assert result["losses_bitwise_equal"], result
    assert result["validation_losses_equal"], result
    assert result["complete"] and result["leftover_temporaries"] == [], result


MODEL = riftco.TransformerConfig(
    vocab_size=256, d_model=32, n_heads=2, n_layers=2, d_ff=64, max_seq_len=32,
    attention_dropout=0.1,
)
TEXT = riftco.Corpus(
    np.frombuffer(b"resumable runs keep every state they need. " * 100, dtype=np.uint8).copy(),
    "test text",
)


def _config(**kw: Any) -> riftco.PretrainingConfig:
    settings: dict[str, Any] = dict(
        steps=8, batch_size=2, seq_len=16, save_every=2, warmup_steps=1, keep_checkpoints=10
    )
    settings.update(kw)
    return riftco.PretrainingConfig(**settings)


def _run(out: Path, **kw: Any) -> dict[str, Any]:
    config = kw.pop("config", _config())
    return riftco.run_pretraining(MODEL, config, TEXT, out, progress=False, plots=False, **kw)


def _rewind(out: Path, step: int) -> None:
    """Leaves ``out`` as a run killed after its checkpoint of ``step``."""
    for ck in training_state.find_checkpoints(out):
        if int(ck.name.split("-")[1]) > step:
            shutil.rmtree(ck)


def test_a_checkpoint_holds_model_optimizer_and_trainer_state(tmp_path: Path) -> None:
    meta = _run(tmp_path, config=_config(keep_checkpoints=2))
    found = training_state.find_checkpoints(tmp_path)
    assert [p.name for p in found] == ["step-00000006", "step-00000008"]  # the newest 2
    names = sorted(p.name for p in found[-1].iterdir())
    assert names == ["config.json", "model.safetensors", "optimizer.safetensors",
                     "trainer_state.json"]
    state = json.loads((found[-1] / "trainer_state.json").read_text())
    assert state["step"] == 8 and state["metadata"]["losses"] == meta["losses"]
    assert state["dropout_step"] == meta["dropout"]["dropout_step"] > 0
    assert state["math"]["training_config"]["lr"] == 3e-3
    assert "log_every" not in state["math"]["training_config"]
    assert state["math_hash"] == training_state.math_hash(state["math"])
    assert state["sampler"]["bit_generator"] == "PCG64"


def test_saves_leave_nothing_in_the_buffer_pool(tmp_path: Path) -> None:
    # Weights of 16384 elements (the 256 x 64 embeddings, the 64 x 256 feed-forward matrices),
    # so Adam's moments are of the buffer pool's sizes (64 KiB and more). A save that wrapped
    # copies of the moments in tensors left them in the pool, where no step takes them back:
    # the cached bytes grew by the moments' bytes (here 640 KiB) at every save.
    model = riftco.TransformerConfig(
        vocab_size=256, d_model=64, n_heads=2, n_layers=1, d_ff=256, max_seq_len=32
    )
    meta = riftco.run_pretraining(
        model, _config(steps=12, save_every=2), TEXT, tmp_path, progress=False, plots=False
    )
    cached = meta["memory_per_step"]["cached"]
    # Recorded during each step: cached[i] is after the saves of steps 2, 4, ... up to i.
    after_saves = cached[2::2]
    assert len(after_saves) == 5 and after_saves[0] > 0, cached  # the pool is on
    assert after_saves == [after_saves[0]] * 5, cached


def test_resume_continues_exactly_and_records_where_it_resumed(tmp_path: Path) -> None:
    full = _run(tmp_path / "full")
    _run(tmp_path / "cut")
    _rewind(tmp_path / "cut", 4)
    resumed = _run(tmp_path / "cut", resume=True, config=_config(log_every=3, save_every=3))
    assert resumed["losses"] == full["losses"]
    assert resumed["validation_losses"] == full["validation_losses"]
    assert resumed["resumes"] == [
        {"step": 4, "from": str(tmp_path / "cut" / "checkpoints" / "step-00000004")}
    ]
    a = riftco.load_model(tmp_path / "full")
    b = riftco.load_model(tmp_path / "cut")
    for (name, p), (_, q) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        assert np.array_equal(p.numpy().view(np.uint32), q.numpy().view(np.uint32)), name


def test_resume_refuses_settings_that_change_the_math_naming_both_values(
    tmp_path: Path,
) -> None:
    _run(tmp_path)
    _rewind(tmp_path, 4)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    with pytest.raises(riftco.ConfigError) as e:
        _run(tmp_path, resume=True, config=_config(lr=1e-3, seed=5))
    message = str(e.value)
    assert "training_config.lr: 0.003 in the checkpoint, 0.001 now" in message
    assert "training_config.seed: 0 in the checkpoint, 5 now" in message
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # nothing written


def test_a_folder_holding_a_run_is_refused_without_resume_or_overwrite(tmp_path: Path) -> None:
    _run(tmp_path)
    with pytest.raises(riftco.OutputDirError, match="holds a run.*resume=True.*overwrite=True"):
        _run(tmp_path)
    with pytest.raises(riftco.OutputDirError, match="exclude each other"):
        _run(tmp_path, resume=True, overwrite=True)
    # overwrite replaces the run, its checkpoints included (never resumed into the new run).
    meta = _run(tmp_path, overwrite=True, config=_config(steps=3, save_every=5))
    assert meta["steps_completed"] == 3 and "resumes" not in meta
    assert [p.name for p in training_state.find_checkpoints(tmp_path)] == ["step-00000003"]


def test_resume_of_an_empty_folder_starts_at_step_zero(tmp_path: Path) -> None:
    lines: list[str] = []
    meta = _run(tmp_path / "new", resume=True, log=lines.append)
    assert meta["complete"] and any("starting at step 0" in line for line in lines)


def test_resume_of_a_finished_run_changes_nothing(tmp_path: Path) -> None:
    first = _run(tmp_path)
    again = _run(tmp_path, resume=True)
    assert again["losses"] == first["losses"] and again["complete"]


@pytest.mark.parametrize(
    ("damage", "named"),
    [
        ("delete_optimizer", "optimizer.safetensors"),
        ("truncate_optimizer", "optimizer.safetensors"),
        ("truncate_trainer_state", "trainer_state.json"),
        ("edit_math", "trainer_state.json"),
        ("delete_model", "model.safetensors"),
    ],
)
def test_a_broken_checkpoint_is_a_model_state_error_naming_the_file(
    tmp_path: Path, damage: str, named: str
) -> None:
    _run(tmp_path)
    _rewind(tmp_path, 6)
    ck = tmp_path / "checkpoints" / "step-00000006"
    if damage == "delete_optimizer":
        (ck / "optimizer.safetensors").unlink()
    elif damage == "truncate_optimizer":
        data = (ck / "optimizer.safetensors").read_bytes()
        (ck / "optimizer.safetensors").write_bytes(data[: len(data) // 2])
    elif damage == "truncate_trainer_state":
        data = (ck / "trainer_state.json").read_bytes()
        (ck / "trainer_state.json").write_bytes(data[:100])
    elif damage == "edit_math":
        state = json.loads((ck / "trainer_state.json").read_text())
        state["math"]["training_config"]["lr"] = 1.0
        (ck / "trainer_state.json").write_text(json.dumps(state))
    else:
        (ck / "model.safetensors").unlink()
    top = (tmp_path / "model.safetensors").read_bytes()
    with pytest.raises((riftco.ModelStateError, OSError)) as e:
        _run(tmp_path, resume=True)
    assert named in str(e.value)
    if damage == "truncate_optimizer":
        # Named once, as the optimizer state (not "model state").
        message = str(e.value)
        assert message.count("optimizer.safetensors") == 1, message
        assert "model state" not in message and "optimizer state" in message, message
    assert (tmp_path / "model.safetensors").read_bytes() == top  # nothing overwritten
    assert (ck / "trainer_state.json").exists()


def test_an_optimizer_state_of_other_parameters_is_refused(tmp_path: Path) -> None:
    _run(tmp_path / "a")
    other = riftco.TransformerConfig(
        vocab_size=256, d_model=32, n_heads=2, n_layers=1, d_ff=64, max_seq_len=32
    )
    riftco.run_pretraining(other, _config(), TEXT, tmp_path / "b", progress=False, plots=False)
    _rewind(tmp_path / "a", 6)
    ck = tmp_path / "a" / "checkpoints" / "step-00000006"
    shutil.copy(
        tmp_path / "b" / "checkpoints" / "step-00000008" / "optimizer.safetensors",
        ck / "optimizer.safetensors",
    )
    with pytest.raises(riftco.ModelStateError, match="optimizer.safetensors") as e:
        _run(tmp_path / "a", resume=True)
    message = str(e.value)
    assert "does not fit this run" in message and "invalid config" not in message, message
    assert message.count("optimizer state") == 1, message


def test_a_checkpoint_that_cannot_be_written_stops_the_run_and_keeps_the_previous(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The injected failure: the trainer state of the checkpoint of step 4 meets a full disk.
    real = riftco._native.write_file_atomic
    calls = {"n": 0}

    def failing(path: Any, data: bytes) -> None:
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real(path, data)

    monkeypatch.setattr(training_state, "write_file_atomic", failing)
    with pytest.raises(riftco.CheckpointWriteError) as e:
        _run(tmp_path)
    message = str(e.value)
    assert "step 4" in message and "step-00000004" in message and "bytes" in message
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step-00000002"]
    monkeypatch.undo()
    meta = _run(tmp_path, resume=True)
    assert meta["resumes"][0]["step"] == 2 and meta["complete"]


def test_a_full_filesystem_keeps_the_previous_checkpoint(tmp_path: Path) -> None:
    mount = tmp_path / "small"
    mount.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
        capture_output=True, text=True,
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({r.stderr.strip()}); the injected "
                    "failure test covers the same path")
    try:
        # A checkpoint of this model is ~450 KB (148 KB of weights, twice that of Adam moments),
        # plus the 148 KB model at the top level: the second checkpoint overfills 1 MiB.
        with pytest.raises(riftco.CheckpointWriteError) as e:
            _run(mount / "run")
        assert "disk is full" in str(e.value) and str(mount / "run") in str(e.value)
        found = training_state.find_checkpoints(mount / "run")
        assert found, "the first checkpoint should have fitted"
        training_state.read_checkpoint(found[-1])
        assert not [p for p in (mount / "run" / "checkpoints").iterdir()
                    if p.name.startswith(".")]
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def test_cli_resume_and_refusal(tmp_path: Path) -> None:
    data = tmp_path / "text.txt"
    data.write_bytes(b"the command resumes its runs too. " * 200)
    base = [
        sys.executable, "-m", "riftco", "pretrain", "--data", str(data), "--out",
        str(tmp_path / "run"), "--steps", "6", "--batch-size", "2", "--seq-len", "16",
        "--d-model", "32", "--n-heads", "2", "--n-layers", "1", "--d-ff", "64",
        "--max-seq-len", "32", "--save-every", "2", "--no-progress", "--no-plots",
        "--sample-tokens", "4",
    ]
    r = subprocess.run(base, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    _rewind(tmp_path / "run", 2)
    r = subprocess.run([*base, "--resume"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "resuming pretraining at step 2/6" in r.stderr
    r = subprocess.run([*base, "--resume", "--lr", "0.01"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 2
    assert "training_config.lr: 0.003 in the checkpoint, 0.01 now" in r.stderr
    r = subprocess.run([*base, "--resume", "--overwrite"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 2 and "exclude each other" in r.stderr


def test_ctrl_c_checkpoints_the_step_it_ends_and_resume_continues_exactly(
    tmp_path: Path,
) -> None:
    import os
    import signal

    full = _run(tmp_path / "full", config=_config(eval_every=3))

    def log(line: str) -> None:
        if line.startswith("step 5/"):
            os.kill(os.getpid(), signal.SIGINT)  # lands after step 5 (and its save) is whole

    cfg = _config(eval_every=3, log_every=1)
    with pytest.raises(riftco.TrainingInterrupted) as e:
        riftco.run_pretraining(MODEL, cfg, TEXT, tmp_path / "cut", progress=False, plots=False,
                               log=log)
    assert e.value.saved_step == 5
    assert (tmp_path / "cut" / "checkpoints" / "step-00000005").is_dir()
    meta = json.loads((tmp_path / "cut" / "training_metadata.json").read_text())
    assert meta["saved_step"] == 5 and len(meta["losses"]) == 5 and not meta["complete"]
    resumed = _run(tmp_path / "cut", resume=True, config=cfg)
    assert resumed["losses"] == full["losses"]
    assert resumed["validation_losses"] == full["validation_losses"]


def test_stale_checkpoint_temporaries_of_dead_processes_are_removed(tmp_path: Path) -> None:
    """A kill can leave a checkpoint's temporary folder and, inside ``checkpoints/``, the
    temporary of the model save into it (``..step-N.tmp.<pid>.tmp.<pid>.<n>``): both go at the
    next save when their process is gone; a running process's temporaries and other names stay."""
    from riftco.training import state as training_state

    child = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    dead, alive = int(child.stdout), os.getpid()
    names = {
        f".step-00000120.tmp.{dead}": False,
        f"..step-00000120.tmp.{dead}.tmp.{dead}.0": False,
        f".step-00000120.tmp.{alive}": True,
        f"..step-00000120.tmp.{alive}.tmp.{alive}.0": True,
        f".notes.tmp.{dead}": True,
        "step-00000117": True,
    }
    for name in names:
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.safetensors").write_bytes(b"x")
    training_state.remove_stale_temporaries(tmp_path)
    assert {p.name for p in tmp_path.iterdir()} == {n for n, keep in names.items() if keep}
