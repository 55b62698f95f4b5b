"""Model files from an attacker or a crash: special files, crafted metadata, and saves killed
with SIGKILL at random moments.

Every load of a file that could make the old code allocate without bound or block runs in a
child process under an address-space limit (``RLIMIT_AS``, set in ``preexec_fn``) and a
timeout, so a regression fails the test instead of taking the machine down or hanging.
"""

from __future__ import annotations

import json
import os
import random
import resource
import signal
import struct
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import riftco

MEMORY_LIMIT_BYTES = 4_000_000_000
CHILD_TIMEOUT_S = 60


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))


def run_limited(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Runs ``code`` in a fresh interpreter under the memory limit and the timeout."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
        preexec_fn=_limit_memory,
    )


def small_model(n_layers: int = 2, seed: int = 1) -> riftco.DecoderOnlyTransformer:
    cfg = riftco.TransformerConfig(
        vocab_size=64, d_model=32, n_heads=4, n_layers=n_layers, d_ff=48, max_seq_len=16, seed=seed
    )
    return riftco.DecoderOnlyTransformer(cfg)


def split(data: bytes) -> tuple[dict[str, Any], bytes]:
    (n,) = struct.unpack("<Q", data[:8])
    header: dict[str, Any] = json.loads(data[8 : 8 + n])
    return header, data[8 + n :]


def join(header: dict[str, Any], rest: bytes) -> bytes:
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + rest


def fnv1a64_hex(data: bytes) -> str:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


# The child prints the exception class and message of each load, one line each.
LOAD_EACH = """
    import sys, riftco
    for p in sys.argv[1:]:
        try:
            riftco.DecoderOnlyTransformer.load(p)
            print("OK", p)
        except Exception as e:
            print(type(e).__name__, str(e).replace("\\n", " "))
"""


def load_in_child(*paths: Path) -> list[str]:
    out = run_limited(LOAD_EACH, *map(str, paths))
    assert out.returncode == 0, f"child failed ({out.returncode}): {out.stderr[-2000:]}"
    lines = out.stdout.splitlines()
    assert len(lines) == len(paths), out.stdout
    return lines


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs and /dev/zero (POSIX)")
def test_special_files_are_clear_errors(tmp_path: Path) -> None:
    zero, urandom = tmp_path / "zero.safetensors", tmp_path / "urandom.safetensors"
    zero.symlink_to("/dev/zero")
    urandom.symlink_to("/dev/urandom")
    fifo = tmp_path / "fifo.safetensors"
    os.mkfifo(fifo)
    folder = tmp_path / "dir.safetensors"
    folder.mkdir()
    lines = load_in_child(zero, urandom, fifo, folder)
    assert lines[0].startswith("ModelStateError") and "character device" in lines[0], lines[0]
    assert lines[1].startswith("ModelStateError") and "character device" in lines[1], lines[1]
    assert lines[2].startswith("ModelStateError") and "FIFO" in lines[2], lines[2]
    assert lines[3].startswith("IsADirectoryError"), lines[3]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs (POSIX)")
def test_special_adapter_files_are_clear_errors(tmp_path: Path) -> None:
    code = """
        import os, sys, riftco
        d = sys.argv[1]
        cfg = riftco.TransformerConfig(vocab_size=64, d_model=32, n_heads=4, n_layers=1,
                                       d_ff=48, max_seq_len=16)
        m = riftco.DecoderOnlyTransformer(cfg)
        try:
            m.load_lora(d)
        except Exception as e:
            print(type(e).__name__, e, m.has_lora)
    """
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    os.mkfifo(adapter / "adapter_model.safetensors")
    out = run_limited(code, str(adapter))
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("ModelStateError") and "FIFO" in out.stdout, out.stdout
    assert out.stdout.strip().endswith("False"), out.stdout


@pytest.mark.parametrize("exponent", [40, 62])
def test_crafted_max_seq_len_is_a_clear_error(tmp_path: Path, exponent: int) -> None:
    path = tmp_path / "model.safetensors"
    small_model().save(path)
    header, rest = split(path.read_bytes())
    cfg = json.loads(header["__metadata__"]["riftco_config"])
    cfg["max_seq_len"] = 2**exponent
    header["__metadata__"]["riftco_config"] = json.dumps(cfg)
    crafted = tmp_path / "crafted.safetensors"
    crafted.write_bytes(join(header, rest))

    # The same through max_position_embeddings of a plain Hugging Face config.json.
    hf_dir = tmp_path / "hf"
    hf_dir.mkdir()
    del header["__metadata__"]["riftco_config"]
    (hf_dir / "model.safetensors").write_bytes(join(header, rest))
    hf = json.loads((tmp_path / "config.json").read_text())
    del hf["riftco"]
    hf["max_position_embeddings"] = 2**exponent
    (hf_dir / "config.json").write_text(json.dumps(hf))

    for line in load_in_child(crafted, hf_dir / "model.safetensors"):
        assert line.split()[0] in {"ModelStateError", "ConfigError", "MemoryError"} or (
            line.split()[0].endswith("Error") and line.split()[0] != "OK"
        ), line
        assert "max_seq_len" in line, line


# ---------------------------------------------------------------------------------------------
# kill -9 during saves
# ---------------------------------------------------------------------------------------------

# Two models (n_layers 1 and 2) and two adapters (rank 2 and 4) the child saves in turn, as
# fast as it can, until it is killed. The parent builds the same four from the same seeds.
KILL_SIZES: dict[str, Any] = dict(vocab_size=256, d_model=128, n_heads=4, d_ff=256, max_seq_len=32)

SAVE_LOOP = """
    import sys, riftco
    what, target = sys.argv[1], sys.argv[2]
    sizes = dict(vocab_size=256, d_model=128, n_heads=4, d_ff=256, max_seq_len=32)
    def base(n_layers):
        return riftco.DecoderOnlyTransformer(
            riftco.TransformerConfig(n_layers=n_layers, seed=n_layers, **sizes))
    if what == "metadata":
        from pathlib import Path
        from riftco.training import run_folder as stages
        models = [{"step": 1, "losses": [0.5] * 100_000}, {"step": 2, "losses": [0.25] * 50_000}]
        save = lambda m: stages.write_json_atomic(Path(target), m)
    elif what == "save":
        models = [base(1), base(2)]
        save = lambda m: m.save(target)
    else:
        models = []
        for rank in (2, 4):
            m = base(1)
            m.enable_lora(rank=rank, alpha=2.0 * rank, mlp=True, seed=rank)
            models.append(m)
        save = lambda m: m.save_lora(target)
    print("ready", flush=True)
    i = 0
    while True:
        save(models[i % 2])
        i += 1
"""


def kill_base(n_layers: int) -> riftco.DecoderOnlyTransformer:
    cfg = riftco.TransformerConfig(n_layers=n_layers, seed=n_layers, **KILL_SIZES)
    return riftco.DecoderOnlyTransformer(cfg)


def weights(pairs: list[tuple[str, riftco.Variable]]) -> dict[str, np.ndarray[Any, Any]]:
    return {n: p.numpy().copy() for n, p in pairs}


def same(a: dict[str, np.ndarray[Any, Any]], b: dict[str, np.ndarray[Any, Any]]) -> bool:
    return a.keys() == b.keys() and all(
        a[k].shape == b[k].shape and np.array_equal(a[k], b[k]) for k in a
    )


def our_temporaries(folder: Path) -> list[str]:
    """Temporaries of our naming (``.{name}.tmp.{pid}.{n}``) and of the ``tempfile`` crate that
    the old writer used (``.tmpXXXXXX``)."""
    names = (p.name for p in folder.iterdir())
    return sorted(n for n in names if ".tmp." in n or n.startswith(".tmp"))


def kill_during(what: str, target: Path, rng: random.Random) -> None:
    """Starts the save loop, kills it with SIGKILL at a random moment after it is ready."""
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(SAVE_LOOP), what, str(target)],
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=_limit_memory,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.0, 0.08))
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=CHILD_TIMEOUT_S)


def test_metadata_writes_killed_at_random_moments_leave_one_whole_file(tmp_path: Path) -> None:
    """``training_metadata.json`` goes through the model files' atomic writer: a writer killed
    at any moment leaves the old or the new file whole, and the next write removes the
    temporaries killed writers left (nothing else stays in the folder)."""
    rng = random.Random(13)
    target = tmp_path / riftco.stages.METADATA_FILE
    for _ in range(6):
        kill_during("metadata", target, rng)
        if target.exists():
            assert json.loads(target.read_text())["step"] in (1, 2)
    riftco.training.run_folder.write_json_atomic(target, {"step": 0})
    assert json.loads(target.read_text()) == {"step": 0}
    assert os.listdir(tmp_path) == [target.name]


def test_saves_killed_at_random_moments_leave_one_whole_state(tmp_path: Path) -> None:
    rng = random.Random(11)
    models = {n: weights(kill_base(n).named_parameters()) for n in (1, 2)}
    adapters = {}
    for rank in (2, 4):
        m = kill_base(1)
        m.enable_lora(rank=rank, alpha=2.0 * rank, mlp=True, seed=rank)
        adapters[rank] = weights(m.named_lora_parameters())

    out = tmp_path / "run"
    out.mkdir()
    state, adapter = out / "model.safetensors", out / "adapter"
    kill_base(1).save(state)
    first = kill_base(1)
    first.enable_lora(rank=2, alpha=4.0, mlp=True, seed=2)
    first.save_lora(adapter)
    loaded_as = {"model 1": 0, "model 2": 0, "rank 2": 0, "rank 4": 0}
    stale_config_json = 0
    for i in range(50):
        if i % 2 == 0:
            kill_during("save", state, rng)
            back = riftco.DecoderOnlyTransformer.load(state)
            got = weights(back.named_parameters())
            matches = [n for n in (1, 2) if same(got, models[n])]
            assert len(matches) == 1, f"kill {i}: the state is neither model"
            assert back.config.n_layers == matches[0]
            loaded_as[f"model {matches[0]}"] += 1
            # config.json is always a whole config.json of one of the two saves; the state names
            # its own, so one from the other save (a kill between the two renames) is told apart.
            config_json = (out / "config.json").read_bytes()
            assert json.loads(config_json)["num_hidden_layers"] in (1, 2), f"kill {i}"
            header, _ = split(state.read_bytes())
            named = header["__metadata__"]["riftco_config_json_fnv1a64"]
            if named != fnv1a64_hex(config_json):
                stale_config_json += 1
                assert json.loads(config_json)["num_hidden_layers"] != matches[0]
            kill_base(1).save(state)  # the next successful save
        else:
            kill_during("save_lora", adapter, rng)
            base = kill_base(1)
            base.load_lora(adapter)
            got = weights(base.named_lora_parameters())
            matches = [r for r in (2, 4) if same(got, adapters[r])]
            assert len(matches) == 1, f"kill {i}: the adapter is neither rank"
            loaded_as[f"rank {matches[0]}"] += 1
            m = kill_base(1)
            m.enable_lora(rank=2, alpha=4.0, mlp=True, seed=2)
            m.save_lora(adapter)  # the next successful save
        assert our_temporaries(out) == [], f"kill {i}"
        assert our_temporaries(adapter) == [], f"kill {i}"
    # Both outcomes occur: the kills land inside saves of either model.
    print(f"loaded as {loaded_as}; config.json of the other save after {stale_config_json} of 25")
    assert all(v > 0 for v in loaded_as.values()), loaded_as


# ---------------------------------------------------------------------------------------------
# Hugging Face RoPE config (transformers 5 rope_parameters)
# ---------------------------------------------------------------------------------------------


def hf_only_folder(tmp_path: Path, theta: float, rope: dict[str, Any]) -> Path:
    """A state without riftco metadata beside a plain Hugging Face config.json with ``rope``
    instead of the RoPE keys riftco writes."""
    cfg = riftco.TransformerConfig(
        vocab_size=64, d_model=32, n_heads=4, n_layers=1, d_ff=48, max_seq_len=16, rope_theta=theta
    )
    riftco.DecoderOnlyTransformer(cfg).save(tmp_path / "model.safetensors")
    header, rest = split((tmp_path / "model.safetensors").read_bytes())
    del header["__metadata__"]["riftco_config"]
    plain = tmp_path / "plain.safetensors"
    plain.write_bytes(join(header, rest))
    hf = json.loads((tmp_path / "config.json").read_text())
    for key in ("riftco", "rope_theta", "rope_scaling", "rope_parameters"):
        hf.pop(key, None)
    hf.update(rope)
    (tmp_path / "config.json").write_text(json.dumps(hf))
    return plain


def test_transformers_5_rope_parameters_set_theta(tmp_path: Path) -> None:
    rope = {"rope_parameters": {"rope_theta": 50000.0, "rope_type": "default"}}
    plain = hf_only_folder(tmp_path, 50000.0, rope)
    back = riftco.DecoderOnlyTransformer.load(plain)
    assert back.config.rope_theta == 50000.0
    reference = riftco.DecoderOnlyTransformer.load(tmp_path / "model.safetensors")
    tokens = np.arange(12, dtype=np.int64).reshape(1, 12)
    np.testing.assert_array_equal(back.logits(tokens).numpy(), reference.logits(tokens).numpy())


@pytest.mark.parametrize(
    "rope",
    [
        {"rope_parameters": {"rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0}},
        {"rope_parameters": {"rope_theta": 500000.0, "rope_type": "longrope", "factor": 8.0}},
        {"rope_scaling": {"type": "dynamic", "factor": 2.0}},
        {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
    ],
)
def test_unsupported_rope_types_are_refused_by_name(tmp_path: Path, rope: dict[str, Any]) -> None:
    plain = hf_only_folder(tmp_path, 50000.0, rope)
    (params,) = rope.values()
    name = params.get("rope_type", params.get("type"))
    with pytest.raises(riftco.ModelStateError, match=f'"{name}"'):
        riftco.DecoderOnlyTransformer.load(plain)


def test_rope_parameters_match_transformers(tmp_path: Path) -> None:
    try:
        import torch  # type: ignore[import-not-found, unused-ignore]
        import transformers  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        pytest.skip("torch/transformers not installed: the LlamaForCausalLM comparison is skipped")
    rope = {"rope_parameters": {"rope_theta": 50000.0, "rope_type": "default"}}
    plain = hf_only_folder(tmp_path, 50000.0, rope)
    ours = riftco.DecoderOnlyTransformer.load(plain)
    hf_dir = tmp_path / "hf"
    hf_dir.mkdir()
    (hf_dir / "config.json").write_bytes((tmp_path / "config.json").read_bytes())
    (hf_dir / "model.safetensors").write_bytes(plain.read_bytes())
    theirs = transformers.LlamaForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32)
    tokens = np.arange(12, dtype=np.int64).reshape(1, 12)
    with torch.no_grad():
        want = theirs(torch.tensor(tokens)).logits[0].numpy()
    np.testing.assert_allclose(ours.logits(tokens).numpy(), want, rtol=1e-4, atol=1e-4)


def test_load_warns_when_config_json_is_not_the_one_saved_with_the_state(tmp_path: Path) -> None:
    # What a save killed between its two renames leaves: the newer config.json beside the older
    # state. The state loads whole, with its own config, and the mismatch is not silent.
    old = small_model(n_layers=1, seed=3)
    old.save(str(tmp_path / "model.safetensors"))
    other = tmp_path / "other"
    other.mkdir()
    small_model(n_layers=2, seed=4).save(str(other / "model.safetensors"))
    (tmp_path / "config.json").write_bytes((other / "config.json").read_bytes())
    with pytest.warns(RuntimeWarning, match="config.json beside this model state"):
        back = riftco.DecoderOnlyTransformer.load(str(tmp_path / "model.safetensors"))
    assert back.config.n_layers == 1
    old.save(str(tmp_path / "model.safetensors"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        riftco.DecoderOnlyTransformer.load(str(tmp_path / "model.safetensors"))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="os.mkfifo is POSIX only")
@pytest.mark.parametrize("kind", ["fifo", "char device"])
def test_save_refuses_to_replace_a_special_file(tmp_path: Path, kind: str) -> None:
    # save() renamed its temporary over whatever was at the destination: a FIFO, or a device
    # node (a symlink to /dev/null here), became a regular file.
    target = tmp_path / "model.safetensors"
    if kind == "fifo":
        os.mkfifo(target)
    else:
        target.symlink_to("/dev/null")
    before = os.stat(target).st_mode
    with pytest.raises(riftco.ModelStateError, match="not a regular file: refusing to replace"):
        small_model().save(str(target))
    assert os.stat(target).st_mode == before
    assert not (tmp_path / "config.json").exists()


def test_corpus_folders_skip_special_files_and_reads_are_bounded(tmp_path: Path) -> None:
    # Inside a folder a FIFO blocked load_corpus forever and a symlink to /dev/zero was read
    # until memory ran out.
    code = """
        import os, sys, riftco
        d = sys.argv[1]
        with open(os.path.join(d, "a.txt"), "w") as f:
            f.write("some text to train on\\n")
        os.mkfifo(os.path.join(d, "b.txt"))
        os.symlink("/dev/zero", os.path.join(d, "c.txt"))
        corpus = riftco.load_corpus([d])
        print("FILES", corpus.files)
        big = os.path.join(d, "big")
        os.mkdir(big)
        with open(os.path.join(big, "x.txt"), "wb") as f:
            f.write(b"y" * 5000)
        try:
            riftco.load_corpus(big, max_bytes=1000)
        except riftco.CorpusError as e:
            print("RAISED", e)
    """
    r = run_limited(code, str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "a.txt" in r.stdout and "b.txt" not in r.stdout and "c.txt" not in r.stdout, r.stdout
    assert "RAISED corpus exceeds 1000 bytes" in r.stdout, r.stdout
