"""The ``riftco`` command (``python -m riftco``) end to end on tiny models: every subcommand,
the per-step records in ``training_metadata.json``, and the messages a new user meets."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import riftco

ROOT = Path(__file__).resolve().parents[2]
TINY_MODEL = ["--d-model", "32", "--n-heads", "2", "--n-layers", "2", "--d-ff", "64"]
TINY_TRAIN = ["--batch-size", "2", "--seq-len", "16", "--warmup-steps", "1", "--no-progress"]
N_PARAMETERS = 37_024  # the tiny model's weights (vocab 256, d_model 32, 2 layers, d_ff 64)


def riftco_cmd(
    *args: str | Path, cwd: Path = ROOT, stdin: str | None = None, timeout_s: float = 300
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "riftco", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=cwd,
        input=stdin,
    )


def one_error_line(r: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", path
    width, height = struct.unpack(">II", data[16:24])
    return int(width), int(height)


@pytest.fixture(scope="module")
def text_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("data") / "text.txt"
    path.write_bytes(bytes(riftco.default_corpus().tokens[:20_000]))
    return path


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory: pytest.TempPathFactory, text_file: Path) -> Path:
    out = tmp_path_factory.mktemp("run") / "pretrain"
    r = riftco_cmd(
        "pretrain",
        *TINY_MODEL,
        "--max-seq-len",
        "32",
        *TINY_TRAIN,
        "--steps",
        "5",
        "--eval-every",
        "2",
        "--data",
        text_file,
        "--out",
        out,
    )
    assert r.returncode == 0, r.stderr
    return out


@pytest.fixture(scope="module")
def post_trained(tmp_path_factory: pytest.TempPathFactory, pretrained: Path) -> Path:
    out = tmp_path_factory.mktemp("run") / "post_train"
    r = riftco_cmd(
        "post-train",
        "--model",
        pretrained,
        "--steps",
        "3",
        "--batch-size",
        "2",
        "--seq-len",
        "16",
        "--lora-rank",
        "2",
        "--lr",
        "0.05",
        "--eval-every",
        "1",
        "--sample-tokens",
        "8",
        "--no-progress",
        "--out",
        out,
    )
    assert r.returncode == 0, r.stderr
    assert "sample before" in r.stdout and "sample after" in r.stdout
    return out


def test_python_m_riftco_lists_the_subcommands() -> None:
    r = riftco_cmd("--help")
    assert r.returncode == 0, r.stderr
    for name in ("pretrain", "post-train", "generate", "export", "plot", "info"):
        assert name in r.stdout
    r = riftco_cmd("--version")
    assert r.returncode == 0 and riftco.__version__ in r.stdout


def test_console_script_is_installed() -> None:
    script = Path(sys.executable).parent / "riftco"
    if not script.exists():
        pytest.skip(f"no console script at {script} (the package was not installed by pip/maturin)")
    r = subprocess.run([str(script), "info"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert f"riftco {riftco.__version__}" in r.stdout


@pytest.mark.parametrize(
    ("command", "defaults"),
    [
        (
            "pretrain",
            {
                "--steps": "600",
                "--batch-size": "16",
                "--seq-len": "128",
                "--lr": "0.003",
                "--warmup-steps": "50",
                "--eval-every": "50",
                "--d-model": "128",
                "--n-heads": "4",
                "--n-layers": "4",
                "--d-ff": "344",
                "--max-seq-len": "128",
                "--temperature": "0.8",
                "--top-k": "40",
                "--out": "runs/pretrain",
            },
        ),
        (
            "post-train",
            {
                "--steps": "200",
                "--batch-size": "8",
                "--lora-rank": "8",
                "--lora-alpha": "16.0",
                "--warmup-steps": "10",
                "--model": "runs/pretrain",
                "--out": "runs/post_train",
            },
        ),
    ],
)
def test_help_shows_every_default(command: str, defaults: dict[str, str]) -> None:
    r = riftco_cmd(command, "--help")
    assert r.returncode == 0, r.stderr
    # argparse wraps help text: join the lines of each flag's entry.
    text = " ".join(r.stdout.split())
    for flag, value in defaults.items():
        entry = text.split(f" {flag} ", 1)[1][:400]
        assert f"(default: {value})" in entry, (flag, entry[:200])


def test_pretrain_records_memory_and_validation_per_step(pretrained: Path) -> None:
    meta = json.loads((pretrained / "training_metadata.json").read_text())
    # The keys recorded before per-step records existed are still there.
    for key in ("losses", "lrs", "step_times_s", "peak_memory_bytes", "final_loss"):
        assert key in meta
    assert meta["validation_loss_before"] is not None and meta["complete"]
    mem = meta["memory_per_step"]
    for category in ("parameter", "gradient", "optimizer_state", "activation", "total", "cached"):
        assert len(mem[category]) == 5, category
    for category, peak in meta["peak_memory_bytes"].items():
        assert peak == max(mem[category]), category
    assert mem["parameter"] == [4 * N_PARAMETERS] * 5
    # Adam keeps two moments per weight; gradients are one per weight at their peak.
    assert mem["optimizer_state"][-1] == 2 * 4 * N_PARAMETERS
    assert all(a > 0 for a in mem["activation"])
    val = meta["validation_losses"]
    assert [v["step"] for v in val] == [0, 2, 4, 5]
    assert val[0]["loss"] == meta["validation_loss_before"]
    assert val[-1]["loss"] == meta["validation_loss_after"]
    assert meta["training_config"]["eval_every"] == 2


def test_eval_every_leaves_the_training_losses_unchanged(text_file: Path, tmp_path: Path) -> None:
    config = riftco.TransformerConfig(
        vocab_size=256, d_model=32, n_heads=2, n_layers=2, d_ff=64, max_seq_len=32, seed=0
    )
    corpus = riftco.load_corpus(text_file)
    runs = []
    for eval_every in (None, 1):
        cfg = riftco.PretrainingConfig(
            steps=4, batch_size=2, seq_len=16, warmup_steps=1, eval_every=eval_every
        )
        out = tmp_path / str(eval_every)
        runs.append(riftco.run_pretraining(config, cfg, corpus, out, progress=False, plots=False))
    assert runs[0]["losses"] == runs[1]["losses"]  # bitwise: the same floats
    assert [v["step"] for v in runs[0]["validation_losses"]] == [0, 4]
    assert [v["step"] for v in runs[1]["validation_losses"]] == [0, 1, 2, 3, 4]
    assert runs[0]["validation_loss_after"] == runs[1]["validation_loss_after"]
    assert not (tmp_path / "None" / "loss.png").exists()


def test_pretrain_writes_both_plots(pretrained: Path) -> None:
    for name in ("loss.png", "memory.png"):
        path = pretrained / name
        assert path.stat().st_size > 10_000, name
        assert png_size(path) == riftco.plotting.PLOT_SIZE_PX


def test_plot_subcommand_rewrites_the_pictures(pretrained: Path, tmp_path: Path) -> None:
    r = riftco_cmd("plot", pretrained, "--out", tmp_path / "pictures")
    assert r.returncode == 0, r.stderr
    for name in ("loss.png", "memory.png"):
        path = tmp_path / "pictures" / name
        assert str(path) in r.stdout
        assert png_size(path) == riftco.plotting.PLOT_SIZE_PX and path.stat().st_size > 10_000


def test_plot_without_a_run_names_the_folder(tmp_path: Path) -> None:
    one_error_line(riftco_cmd("plot", tmp_path / "nothing"), "no training_metadata.json", "nothing")


def test_post_train_lora_records_and_plots(post_trained: Path, pretrained: Path) -> None:
    meta = json.loads((post_trained / "training_metadata.json").read_text())
    assert meta["stage"] == "post_training_lora"
    assert [v["step"] for v in meta["validation_losses"]] == [0, 1, 2, 3]
    assert len(meta["memory_per_step"]["activation"]) == 3
    assert meta["base_model"] == str(pretrained / "model.safetensors")
    for name in ("loss.png", "memory.png"):
        assert png_size(post_trained / name) == riftco.plotting.PLOT_SIZE_PX


def _reference_text(state: Path, adapter: Path | None, prompt: bytes, n: int) -> str:
    model = riftco.load_model(state)
    if adapter is not None:
        model.load_lora(str(adapter))
    out = riftco.generate(model, prompt, n, temperature=0.0, top_k=40, seed=0)
    return riftco.decode_bytes(prompt + out)


def test_generate_from_a_saved_model(pretrained: Path) -> None:
    r = riftco_cmd("generate", "--model", pretrained, "--temperature", "0", "--sample-tokens", "12", "def ")
    assert r.returncode == 0, r.stderr
    expected = _reference_text(pretrained / "model.safetensors", None, b"def ", 12)
    assert r.stdout == expected + "\n"


def test_generate_from_an_adapter_with_the_prompt_on_stdin(
    post_trained: Path, pretrained: Path
) -> None:
    expected = _reference_text(
        pretrained / "model.safetensors", post_trained / "adapter", b"The ", 12
    )
    for model in (post_trained, post_trained / "adapter"):
        r = riftco_cmd(
            "generate", "--model", model, "--temperature", "0", "--sample-tokens", "12", "-",
            stdin="The \n",
        )
        assert r.returncode == 0, r.stderr
        assert r.stdout == expected + "\n"
        assert "LoRA adapter" in r.stderr
    # The adapter changed the model: the base alone continues differently (lr 0.05, 3 steps).
    base = _reference_text(pretrained / "model.safetensors", None, b"The ", 12)
    assert base != expected


def test_generate_default_length_is_capped(pretrained: Path) -> None:
    r = riftco_cmd("generate", "--model", pretrained, "x")
    assert r.returncode == 0, r.stderr
    # max_seq_len 32 leaves 32 positions for a 1-byte prompt: 32 new bytes, not 256.
    assert "32 bytes" in r.stderr


def test_generate_too_long_names_its_own_arguments(pretrained: Path) -> None:
    # generate takes the prompt as PROMPT (positional): the hint must not name a --prompt flag
    # it does not have; --max-new-tokens is its name for the count (--sample-tokens an alias).
    r = riftco_cmd("generate", "--model", pretrained, "--sample-tokens", "40", "x")
    line = one_error_line(r, "pass --max-new-tokens 32 or less, or a shorter PROMPT")
    assert "--prompt" not in line


def test_generate_without_a_model_says_what_to_run(tmp_path: Path) -> None:
    line = one_error_line(riftco_cmd("generate", "hello", cwd=tmp_path), "no model state")
    assert "`riftco pretrain`" in line


def test_info_reports_version_threads_simd_devices() -> None:
    r = riftco_cmd("info")
    assert r.returncode == 0, r.stderr
    assert f"riftco {riftco.__version__}" in r.stdout
    assert f"kernel threads: {riftco.num_threads()}" in r.stdout
    assert f"SIMD level: {riftco.simd_level()}" in r.stdout
    assert "device cpu: available" in r.stdout
    r = riftco_cmd("info", "--json")
    facts = json.loads(r.stdout)
    assert facts["simd_level"] in ("avx512", "avx2", "neon", "scalar")
    assert facts["devices"][0] == {
        "device": "cpu", "available": True, "resolved": "cpu", "adapter": None
    }
    assert [d["device"] for d in facts["devices"]] == ["cpu", "vulkan", "metal", "gpu"]
    # No Metal off macOS: the reason names what was looked for.
    assert not facts["devices"][2]["available"] and "metal" in facts["devices"][2]["reason"]


@pytest.mark.parametrize(
    ("value", "source"),
    [
        ("1", "(RIFTCO_NUM_THREADS=1)"),
        ("0", "(physical cores; RIFTCO_NUM_THREADS='0' ignored)"),
        ("abc", "(physical cores; RIFTCO_NUM_THREADS='abc' ignored)"),
        ("100000", "(RIFTCO_NUM_THREADS=100000, capped at"),
    ],
)
def test_info_says_where_the_thread_count_came_from(value: str, source: str) -> None:
    # A value the kernels ignored or capped is not credited with the count.
    env = dict(os.environ, RIFTCO_NUM_THREADS=value)
    r = subprocess.run(
        [sys.executable, "-m", "riftco", "info"], capture_output=True, text=True, env=env,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if x.startswith("kernel threads:"))
    assert source in line, line


def test_simd_level_follows_force_scalar() -> None:
    code = "import riftco; print(riftco.simd_level())"
    env = dict(os.environ, RIFTCO_FORCE_SCALAR="1")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert r.stdout.strip() == "scalar", r.stderr


def test_parameter_count_constant_matches_the_model() -> None:
    model = riftco.DecoderOnlyTransformer(
        riftco.TransformerConfig(
            vocab_size=256, d_model=32, n_heads=2, n_layers=2, d_ff=64, max_seq_len=32, seed=0
        )
    )
    assert sum(int(np.prod(p.shape)) for p in model.parameters()) == N_PARAMETERS


def test_post_train_refuses_a_lora_rank_above_d_model_before_anything_runs(
    pretrained: Path, tmp_path: Path
) -> None:
    # Checked with the other flags: no corpus line, no sample, no folder.
    out = tmp_path / "o"
    r = riftco_cmd("post-train", "--model", pretrained, "--lora-rank", "100000", "--out", out)
    one_error_line(r, "--lora-rank 100000", "d_model 32", "at most 32")
    assert r.stdout == ""
    assert not out.exists()


def test_post_train_on_a_lora_folder_says_to_pass_its_base(
    post_trained: Path, tmp_path: Path
) -> None:
    for model in (post_trained, post_trained / "adapter"):
        r = riftco_cmd("post-train", "--model", model, "--out", tmp_path / "o")
        one_error_line(r, "LoRA adapters only", "base_model")


def test_an_out_path_that_is_a_file_is_refused_by_name(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    r = riftco_cmd("pretrain", *TINY_MODEL, *TINY_TRAIN, "--steps", "1", "--out", afile)
    one_error_line(r, str(afile), "is a file, not a folder")
    assert afile.read_text() == "keep me"


def _interrupted_pretraining(out: Path, text_file: Path) -> list[str]:
    """Starts ``riftco pretrain`` for many steps with a save every 2, sends SIGINT after its
    third save, and returns the command (without ``--resume``) once it has exited."""
    import signal
    import time

    args = [
        "pretrain", *TINY_MODEL, *TINY_TRAIN, "--steps", "100000", "--save-every", "2",
        "--no-plots", "--data", str(text_file), "--out", str(out),
    ]

    def sigint_default() -> None:
        signal.signal(signal.SIGINT, signal.default_int_handler)

    proc = subprocess.Popen(
        [sys.executable, "-m", "riftco", *args], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, cwd=ROOT, preexec_fn=sigint_default,
    )
    deadline = time.monotonic() + 120
    try:
        while len(riftco.training_state.find_checkpoints(out)) < 3:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no third save within 120 s"
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0 and "--resume" in err, err
    return args


def test_an_unfinished_run_is_not_restarted_without_resume_or_overwrite(
    tmp_path: Path, text_file: Path
) -> None:
    out = tmp_path / "int"
    args = _interrupted_pretraining(out, text_file)
    saved = [p.name for p in riftco.training_state.find_checkpoints(out)]
    step = riftco.training_state.read_checkpoint(out / "checkpoints" / saved[-1]).step
    line = one_error_line(
        riftco_cmd(*args), "unfinished run", f"step {step}", "--resume", "--overwrite"
    )
    assert str(out) in line
    # Another configuration: --resume would not fit, so only --overwrite is offered.
    line = one_error_line(
        riftco_cmd(*args, "--lr", "0.5"), f"unfinished pretraining run (last checkpoint at step "
        f"{step}) of another configuration", "lr", "--overwrite"
    )
    assert "--resume" not in line
    # Nothing was touched.
    assert [p.name for p in riftco.training_state.find_checkpoints(out)] == saved
    # The Python stage refuses the same folder with its own names for the options.
    with pytest.raises(riftco.OutputDirError, match=f"unfinished run .*step {step}.*resume=True"):
        riftco.run_pretraining(
            riftco.TransformerConfig(vocab_size=256, d_model=32, n_heads=2, n_layers=2,
                                     d_ff=64, max_seq_len=16),
            riftco.PretrainingConfig(steps=3, batch_size=2, seq_len=16), riftco.load_corpus(
                [text_file]), out, progress=False, plots=False,
        )


def test_a_closed_output_does_not_end_a_run(tmp_path: Path, text_file: Path) -> None:
    """``riftco pretrain ... | head -1``: stdout and stderr closed by their reader before the run
    prints anything; the run trains to its end, writes its files and exits 0."""
    out = tmp_path / "piped"
    proc = subprocess.Popen(
        [sys.executable, "-m", "riftco", "pretrain", *TINY_MODEL, *TINY_TRAIN, "--steps", "3",
         "--no-plots", "--data", str(text_file), "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    proc.stderr.close()
    assert proc.wait(timeout=300) == 0
    meta = json.loads((out / "training_metadata.json").read_text())
    assert meta["complete"] is True and len(meta["losses"]) == 3
    assert (out / "model.safetensors").is_file()


def test_a_resume_that_does_not_fit_is_one_error_line(tmp_path: Path, text_file: Path) -> None:
    """The stage's own refusal comes before anything else is printed (the corpus and model
    lines are held back until the stage starts)."""
    out = tmp_path / "run"
    args: list[str | Path] = [
        "pretrain", *TINY_MODEL, *TINY_TRAIN, "--steps", "4", "--save-every", "2", "--no-plots",
        "--data", text_file, "--out", out,
    ]
    assert riftco_cmd(*args).returncode == 0
    one_error_line(riftco_cmd(*args, "--resume", "--lr", "0.5"), "cannot resume", "lr")


def test_after_a_resume_the_progress_shows_this_runs_activation_peak(
    tmp_path: Path, text_file: Path
) -> None:
    """Resumed under ``block`` from a run of ``disabled``: the step lines show the peak of the
    steps run under ``block`` (the metadata's whole-run peak keeps the earlier steps')."""
    import shutil

    out = tmp_path / "run"
    args: list[str | Path] = [
        "pretrain", "--d-model", "64", "--n-heads", "4", "--n-layers", "4", "--d-ff", "128",
        "--batch-size", "4", "--seq-len", "64", "--warmup-steps", "1", "--no-progress",
        "--steps", "4", "--save-every", "2", "--no-plots", "--log-every", "1", "--data",
        text_file, "--out", out,
    ]

    def peaks(stderr: str) -> list[float]:
        return [float(line.split("activation peak ")[1].split()[0])
                for line in stderr.splitlines() if "activation peak " in line]

    first = riftco_cmd(*args, "--activation-checkpointing", "disabled")
    assert first.returncode == 0, first.stderr
    shutil.rmtree(out / "checkpoints" / "step-00000004")
    resumed = riftco_cmd(*args, "--activation-checkpointing", "block", "--resume")
    assert resumed.returncode == 0, resumed.stderr
    before, after = peaks(first.stderr), peaks(resumed.stderr)
    assert len(before) == 4 and len(after) == 2, (first.stderr, resumed.stderr)
    assert max(after) < min(before), (before, after)
    # The closing summary says the same, and says whose peak it is.
    assert f"peak activation {max(after):.1f} MiB (steps after the resume at 2)" in resumed.stdout


@pytest.mark.parametrize("how", ["stdout closed", "stderr closed", "stdout full"])
def test_a_closed_or_failing_output_from_the_start_does_not_end_a_run(
    tmp_path: Path, text_file: Path, how: str
) -> None:
    """``riftco pretrain ... >&-``, ``2>&-`` and ``>/dev/full``: the run trains to its end and
    exits 0; a failing file (not a closed pipe) is said once on stderr."""
    out = tmp_path / "run"
    redirect = {"stdout closed": ">&-", "stderr closed": "2>&-", "stdout full": ">/dev/full"}[how]
    command = " ".join(
        [sys.executable, "-m", "riftco", "pretrain", *TINY_MODEL, *TINY_TRAIN, "--steps", "3",
         "--no-plots", "--data", str(text_file), "--out", str(out), redirect]
    )
    r = subprocess.run(["bash", "-c", command], capture_output=True, text=True, cwd=ROOT,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert json.loads((out / "training_metadata.json").read_text())["complete"] is True
    if how == "stdout full":
        assert r.stderr.count("riftco: warning: standard output failed") == 1, r.stderr
    assert "Traceback" not in r.stderr and "Exception ignored" not in r.stderr, r.stderr


def test_overwrite_with_whole_weights_removes_the_replaced_runs_adapter(
    tmp_path: Path, pretrained: Path
) -> None:
    """A LoRA run replaced (--overwrite) by a full fine-tuning run: its adapter/ does not stay
    beside the new weights. The base model's own folder is never touched."""
    out = tmp_path / "tuned"
    common: list[str | Path] = [
        "post-train", "--model", pretrained, "--batch-size", "2", "--seq-len", "16", "--steps",
        "2", "--no-progress", "--no-plots", "--sample-tokens", "4", "--out", out,
    ]
    r = riftco_cmd(*common)
    assert r.returncode == 0, r.stderr
    assert (out / "adapter" / "adapter_config.json").is_file()
    r = riftco_cmd(*common, "--fine-tuning-method", "full", "--lr", "1e-4", "--overwrite")
    assert r.returncode == 0, r.stderr
    assert not (out / "adapter").exists()
    assert (out / "model.safetensors").is_file() and (pretrained / "model.safetensors").is_file()
