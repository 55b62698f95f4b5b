"""The installed package: build the wheel, install it into a fresh virtual environment outside
the source tree, import it from a directory outside the repository and run a tiny training
step."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    import numpy as np
    import riftco

    repo = Path(sys.argv[1]).resolve()
    location = Path(riftco.__file__).resolve()
    assert repo not in location.parents, f"riftco imported from the source tree: {location}"
    assert (location.parent / "py.typed").exists(), "py.typed is missing from the wheel"
    assert any(location.parent.glob("_native/*.pyi")), "type stubs are missing from the wheel"

    config = riftco.TransformerConfig(vocab_size=256, d_model=32, n_heads=4, n_layers=2,
                                      d_ff=64, max_seq_len=32)
    model = riftco.DecoderOnlyTransformer(config, attention="flash",
                                          activation_checkpointing="block").to("cpu")
    try:
        model.to("metal")
    except riftco.DeviceUnavailableError as e:
        assert isinstance(e, RuntimeError)
    else:
        raise AssertionError("metal should be unavailable")
    text = np.frombuffer(b"the quick brown fox jumps over the lazy dog. " * 8, dtype=np.uint8)
    block = np.stack([text[i:i + 17] for i in range(0, 64, 16)]).astype(np.int64)
    opt = riftco.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(8):
        loss = model.loss(block)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    print("losses", " ".join(f"{x:.4f}" for x in losses))
    assert losses[-1] < losses[0] - 0.1, losses
    print("installed-package OK", riftco.__version__)
    """
)


def run(cmd: list[str], cwd: Path, timeout: float, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(
        cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert proc.returncode == 0, f"{cmd} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def test_wheel_installs_into_a_fresh_venv_and_trains() -> None:
    maturin = shutil.which("maturin", path=str(Path(sys.executable).parent)) or shutil.which(
        "maturin"
    )
    if maturin is None:
        pytest.fail("maturin is not installed (scripts/setup.sh installs it into .venv)")
    with tempfile.TemporaryDirectory(prefix="riftco-wheel-test-") as tmp_str:
        tmp = Path(tmp_str).resolve()
        assert REPO_ROOT not in tmp.parents
        wheels = tmp / "wheels"
        env = dict(os.environ)
        env.pop("VIRTUAL_ENV", None)
        run(
            [maturin, "build", "--release", "--quiet", "-o", str(wheels),
             "--interpreter", sys.executable],
            cwd=REPO_ROOT,
            timeout=900,
            env=env,
        )
        (wheel,) = wheels.glob("riftco-*.whl")
        venv = tmp / "venv"
        run([sys.executable, "-m", "venv", str(venv)], cwd=tmp, timeout=120)
        py = venv / "bin" / "python"
        # numpy comes from the index (or the local pip cache); the wheel from the build folder.
        run(
            [str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
             str(wheel)],
            cwd=tmp,
            timeout=300,
        )
        script = tmp / "tiny_train.py"
        script.write_text(SCRIPT, encoding="utf-8")
        clean_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        out = run([str(py), str(script), str(REPO_ROOT)], cwd=tmp, timeout=300, env=clean_env)
        assert "installed-package OK" in out
