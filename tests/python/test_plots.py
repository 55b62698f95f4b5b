"""``riftco.training.plotting``: the pictures' size and content source, and the message without
matplotlib (simulated in a subprocess by making ``import matplotlib`` fail)."""

from __future__ import annotations

import importlib.util
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import riftco
from riftco.training import plotting

ROOT = Path(__file__).resolve().parents[2]
HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None
TINY = [
    "--d-model", "32", "--n-heads", "2", "--n-layers", "2", "--d-ff", "64", "--max-seq-len", "32",
    "--steps", "3", "--batch-size", "2", "--seq-len", "16", "--warmup-steps", "1",
    "--no-progress", "--sample-tokens", "4",
]  # fmt: skip

# Runs the riftco command with matplotlib unimportable (a None entry in sys.modules makes
# `import matplotlib` raise ImportError, as when it is not installed).
WITHOUT_MATPLOTLIB = (
    "import runpy, sys; sys.modules['matplotlib'] = None; "
    "sys.argv = ['riftco', *sys.argv[1:]]; runpy.run_module('riftco', run_name='__main__')"
)


def without_matplotlib(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_MATPLOTLIB, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
    )


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    w, h = struct.unpack(">II", data[16:24])
    return int(w), int(h)


@pytest.fixture(scope="module")
def text_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("data") / "text.txt"
    path.write_bytes(bytes(riftco.default_corpus().tokens[:10_000]))
    return path


def synthetic_metadata(steps: int) -> dict[str, Any]:
    mib = 2**20
    return {
        "stage": "pretraining",
        "model_config": {"d_model": 8, "n_layers": 1, "n_heads": 1},
        "training_config": {"batch_size": 2, "seq_len": 4},
        "activation_checkpointing": "block",
        "uniform_baseline_loss": 5.545,
        "losses": [5.5 - 0.01 * i for i in range(steps)],
        "lrs": [1e-3] * steps,
        "validation_losses": [{"step": 0, "loss": 5.5}, {"step": steps, "loss": 5.0}],
        "memory_per_step": {
            "parameter": [mib] * steps,
            "optimizer_state": [2 * mib] * steps,
            "gradient": [mib] * steps,
            "activation": [3 * mib + i for i in range(steps)],
            "workspace": [0] * steps,
            "total": [7 * mib + i for i in range(steps)],
            "cached": [mib // 2] * steps,
        },
    }


@pytest.mark.skipif(not HAS_MATPLOTLIB, reason="matplotlib is not installed (riftco[plot])")
def test_write_plots_from_a_dict(tmp_path: Path) -> None:
    written = plotting.write_plots(synthetic_metadata(20), tmp_path)
    assert written == [tmp_path / "loss.png", tmp_path / "memory.png"]
    for path in written:
        data = path.read_bytes()
        assert len(data) > 10_000 and png_size(data) == plotting.PLOT_SIZE_PX


@pytest.mark.skipif(not HAS_MATPLOTLIB, reason="matplotlib is not installed (riftco[plot])")
def test_memory_plot_leaves_headroom_above_flat_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A steady pool cache is a flat line; with the axis ending at its value it sat on the
    # panel's top border, nearly invisible. The stack leaves room for the legend above it.
    figures: list[Any] = []
    save = plotting._save

    def keep(fig: Any, path: Path) -> Path:
        figures.append(fig)
        return save(fig, path)

    monkeypatch.setattr(plotting, "_save", keep)
    meta = synthetic_metadata(20)
    plotting.write_plots(meta, tmp_path)
    stack, cache = figures[-1].axes[:2]
    mib = 2.0**20
    assert cache.get_ylim()[1] >= 1.15 * max(meta["memory_per_step"]["cached"]) / mib
    assert stack.get_ylim()[1] >= 1.25 * max(meta["memory_per_step"]["total"]) / mib


@pytest.mark.skipif(not HAS_MATPLOTLIB, reason="matplotlib is not installed (riftco[plot])")
def test_old_metadata_without_per_step_memory_gets_the_loss_plot_only(tmp_path: Path) -> None:
    meta = synthetic_metadata(5)
    del meta["memory_per_step"], meta["validation_losses"]
    assert plotting.write_plots(meta, tmp_path) == [tmp_path / "loss.png"]
    assert not (tmp_path / "memory.png").exists()


def test_metadata_without_steps_is_refused(tmp_path: Path) -> None:
    if not HAS_MATPLOTLIB:
        pytest.skip("matplotlib is not installed (riftco[plot])")
    with pytest.raises(plotting.RunMetadataError, match="no training losses"):
        plotting.write_plots({"losses": []}, tmp_path)


def test_plot_without_matplotlib_says_how_to_install(tmp_path: Path) -> None:
    (tmp_path / "training_metadata.json").write_text('{"losses": [1.0]}')
    r = without_matplotlib("plot", tmp_path, cwd=tmp_path)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "matplotlib is not installed" in lines[0] and "pip install 'riftco[plot]'" in lines[0]


def test_training_without_matplotlib_still_succeeds(tmp_path: Path, text_file: Path) -> None:
    out = tmp_path / "run"
    r = without_matplotlib("pretrain", *TINY, "--data", text_file, "--out", out, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "plots not written: matplotlib is not installed" in r.stderr
    assert "pip install 'riftco[plot]'" in r.stderr
    assert (out / "model.safetensors").is_file() and not (out / "loss.png").exists()


@pytest.mark.skipif(not HAS_MATPLOTLIB, reason="matplotlib is not installed (riftco[plot])")
def test_no_plots_flag_writes_none(tmp_path: Path, text_file: Path) -> None:
    out = tmp_path / "run"
    r = subprocess.run(
        [sys.executable, "-m", "riftco", "pretrain", *TINY, "--no-plots", "--data", str(text_file),
         "--out", str(out)],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert not (out / "loss.png").exists() and not (out / "memory.png").exists()
