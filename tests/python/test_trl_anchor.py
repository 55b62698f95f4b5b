"""riftco's instruction data against TRL's ``SFTTrainer`` and transformers (optional
references): for the same rows, tokenizer and chat template, the input ids and the loss masks
equal TRL's, and a loss over them equals transformers' ``LlamaForCausalLM`` on the same weights.

The rows are given to TRL in its shapes: a riftco ``{"messages": [...]}`` row whose last turn is
the assistant's is TRL's conversational prompt/completion (``prompt`` the turns before it,
``completion`` that turn); a ``{"prompt", "completion"}`` row is the same in both. Prompts end on
a token boundary (TRL warns otherwise, and tokens merging across it differ by design: riftco
encodes the prompt and the answer separately)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import riftco
from riftco.hf_tokenizer import load_folder_tokenizer
from riftco.instruct_corpus import load_example_corpus

MISSING = [m for m in ("torch", "transformers", "trl", "datasets", "tokenizers")
           if importlib.util.find_spec(m) is None]
pytestmark = pytest.mark.skipif(
    bool(MISSING), reason=f"TRL anchor needs {', '.join(MISSING)} (optional references)"
)

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CHAT_ROWS: list[dict[str, Any]] = [
    {"messages": [{"role": "user", "content": "What does len do?"},
                  {"role": "assistant", "content": "It returns the number of items."}]},
    {"messages": [{"role": "system", "content": "Be brief."},
                  {"role": "user", "content": "And abs?"},
                  {"role": "assistant", "content": "The absolute value of a number."}]},
    {"messages": [{"role": "user", "content": "Sort a list?"},
                  {"role": "assistant", "content": "Use sorted(items) for a new list."}]},
]
PC_ROWS: list[dict[str, Any]] = [
    {"prompt": "Question: what is 2+2?\nAnswer:", "completion": " four"},
    {"prompt": "Question: name a colour.\nAnswer:", "completion": " blue, like the sky"},
    {"prompt": "Question: a prime?\nAnswer:", "completion": " seven"},
]


def _mod(name: str) -> Any:
    return importlib.import_module(name)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch, tk, tf = _mod("torch"), _mod("tokenizers"), _mod("transformers")
    Tokenizer, decoders, models = tk.Tokenizer, tk.decoders, tk.models
    pre_tokenizers, trainers = tk.pre_tokenizers, tk.trainers
    LlamaConfig, LlamaForCausalLM = tf.LlamaConfig, tf.LlamaForCausalLM
    PreTrainedTokenizerFast = tf.PreTrainedTokenizerFast

    out = tmp_path_factory.mktemp("hf") / "model"
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    text = [json.dumps(r) for r in CHAT_ROWS + PC_ROWS] * 20
    tok.train_from_iterator(text, trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|im_start|>", "<|im_end|>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                     pad_token="<pad>")
    hf_tok.chat_template = CHATML
    hf_tok.save_pretrained(out)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(hf_tok), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                         max_position_embeddings=128, tie_word_embeddings=False,
                         eos_token_id=hf_tok.eos_token_id, pad_token_id=hf_tok.pad_token_id)
    LlamaForCausalLM(config).save_pretrained(out)
    return out


def trl_examples(folder: Path, rows: list[dict[str, Any]], tmp: Path) -> list[tuple[list[int], list[int]]]:
    Dataset = _mod("datasets").Dataset
    tf, trl = _mod("transformers"), _mod("trl")
    AutoTokenizer, LlamaForCausalLM = tf.AutoTokenizer, tf.LlamaForCausalLM
    SFTConfig, SFTTrainer = trl.SFTConfig, trl.SFTTrainer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = LlamaForCausalLM.from_pretrained(folder)
    args = SFTConfig(output_dir=str(tmp / "trl"), report_to=[], max_length=None,
                     dataset_num_proc=None, use_cpu=True)
    trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows),
                         processing_class=tokenizer)
    out = []
    for ex in trainer.train_dataset:
        ids = list(ex["input_ids"])
        if "labels" in ex:  # TRL >= 1.x builds the labels while preparing the dataset
            labels = list(ex["labels"])
        else:
            labels = [t if m else -100 for t, m in zip(ids, ex["completion_mask"], strict=True)]
        out.append((ids, labels))
    return out


def riftco_examples(folder: Path, rows: list[dict[str, Any]], tmp: Path,
                    name: str) -> list[tuple[list[int], list[int]]]:
    path = tmp / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    examples, _ = load_example_corpus([path], folder, seq_len=127,
                                      tokenizer=load_folder_tokenizer(str(folder)))
    return [(a.tolist(), b.tolist()) for a, b in zip(examples.input_ids, examples.labels,
                                                      strict=True)]


def as_trl_conversational(row: dict[str, Any]) -> dict[str, Any]:
    return {"prompt": row["messages"][:-1], "completion": row["messages"][-1:]}


@pytest.mark.parametrize("kind", ["messages", "prompt/completion"])
def test_input_ids_and_loss_masks_equal_trl(folder: Path, tmp_path: Path, kind: str) -> None:
    if kind == "messages":
        ours = riftco_examples(folder, CHAT_ROWS, tmp_path, "chat.jsonl")
        theirs = trl_examples(folder, [as_trl_conversational(r) for r in CHAT_ROWS], tmp_path)
    else:
        ours = riftco_examples(folder, PC_ROWS, tmp_path, "pc.jsonl")
        theirs = trl_examples(folder, PC_ROWS, tmp_path)
    assert len(ours) == len(theirs) == 3
    for (ids, labels), (t_ids, t_labels) in zip(ours, theirs, strict=True):
        assert ids == t_ids
        assert labels == t_labels


def test_a_loss_over_the_examples_equals_transformers(folder: Path, tmp_path: Path) -> None:
    torch = _mod("torch")
    LlamaForCausalLM = _mod("transformers").LlamaForCausalLM

    ours = riftco_examples(folder, CHAT_ROWS, tmp_path, "chat.jsonl")
    width = max(len(ids) for ids, _ in ours)
    ids = np.zeros((len(ours), width), dtype=np.int64)
    labels = np.full((len(ours), width), -100, dtype=np.int64)
    for b, (i, lab) in enumerate(ours):
        ids[b, : len(i)] = i
        labels[b, : len(lab)] = lab
    model = riftco.load_model(folder)
    ours_loss = model.loss(ids, labels=labels).item()
    hf = LlamaForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        # transformers averages over every target of the batch (shifted labels, -100 ignored).
        theirs = hf(input_ids=torch.from_numpy(ids), labels=torch.from_numpy(labels)).loss.item()
    assert abs(ours_loss - theirs) < 1e-5, (ours_loss, theirs)
