"""Copy pretraining (`gyre.model.copy_pretrain`): its words stay one token in a chain, a drill is
a chain's notes and calls with drawn words (checked against a render of that chain), and the
warm start runs it first when asked."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import msgspec
import pytest
import torch

from gyre.agents.react import COMPACT_PROMPT
from gyre.config import ModelConfig, WarmStartConfig
from gyre.model.copy_pretrain import COPY_ROWS, CopyDrills, copy_pretrain, copyable_words
from gyre.model.demonstrations import encode_conversation
from gyre.model.recipe import build_model, build_tokenizer
from gyre.model.sft import SFT_RECORD, SFTResult, warm_start
from gyre.tasks.suites.learnable_long import FILES, INSTRUCTION, NOTES, WORDS, LongChore


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def test_copyable_words_are_one_token_in_the_note_and_in_the_call(tokenizer) -> None:
    words = copyable_words(tokenizer)
    assert len(words) == 189 and words == sorted(set(words))
    assert set(WORDS) <= set(words) and {f.removesuffix(".txt") for f in FILES} <= set(words)
    for word in words[::7]:
        (token,) = tokenizer.encode(word, add_special_tokens=False)
        note = tokenizer.encode(f'Write the word "{word}" to the file', add_special_tokens=False)
        call = tokenizer.encode(json.dumps({"content": word}), add_special_tokens=False)
        assert token in note and token in call
    # "maple" is spelled in pieces, "a" and "Value" are not lowercase words of 3+ letters
    assert not {"maple", "a", "Value"} & set(words)


def test_a_too_small_vocabulary_is_refused() -> None:
    with pytest.raises(ValueError, match="keeps only .* words whole in a chain"):
        copyable_words(build_tokenizer(vocab_size=300))


def _reference(tokenizer, text: str) -> tuple[list[int], list[bool]]:
    """The drill `text` rebuilt from its notes: the chain's tool results and calls, compacted
    where the drill's summary is, then the sub-agent's prompt and write, encoded."""
    pattern = (
        r'<tool_response>(Delegate to a sub-agent: )?Write the word "(\w+)" to the file "(\w+)\.'
    )
    notes = re.findall(pattern, text)
    assert len(notes) == NOTES
    chore = LongChore(
        words=tuple(w for _, w, _ in notes),
        files=tuple(f"{f}.txt" for _, _, f in notes),
        delegated=[bool(d) for d, _, _ in notes].index(True),
    )
    compacted = text[: text.index("Summarise")].count("<tool_response>") - 1
    conversations: list[list[dict]] = [[]]
    for i in range(NOTES):
        messages = conversations[-1]
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": chore.note(i)})
        if i == compacted:
            summary = {"role": "assistant", "content": chore.note(i)}
            messages += [{"role": "user", "content": COMPACT_PROMPT}, summary]
            progress = f"{INSTRUCTION}\n\nProgress so far:\n{chore.note(i)}"
            conversations.append([{"role": "user", "content": progress}])
            messages = conversations[-1]
        if i == chore.delegated:
            name, arguments = "delegate", {"task": chore.sub_task()}
        else:
            name, arguments = "write_file", {"path": chore.files[i], "content": chore.words[i]}
        function = {"name": name, "arguments": json.dumps(arguments)}
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": f"c{i + 1}", "type": "function", "function": function}],
            }
        )
    parts = [encode_conversation(tokenizer, m, None) for m in conversations]
    write = json.dumps(
        {"path": chore.files[chore.delegated], "content": chore.words[chore.delegated]}
    )
    function = {"name": "write_file", "arguments": write}
    sub = [
        {"role": "user", "content": chore.sub_task()},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "s", "type": "function", "function": function}],
        },
    ]
    parts.append(encode_conversation(tokenizer, sub, None))
    return sum((p.ids for p in parts), []), sum((p.loss_mask for p in parts), [])


def test_a_drill_is_a_chain_rendered_with_its_drawn_words(tokenizer) -> None:
    drills = CopyDrills(tokenizer)
    ids_BS, mask_BS = drills.batch(random.Random(0))
    assert ids_BS.shape[0] == COPY_ROWS and ids_BS.dtype == torch.int64
    delegated, compacted = set(), set()
    for ids, mask in zip(ids_BS.tolist(), mask_BS.tolist()):
        n = max(i for i, m in enumerate(mask) if m) + 1  # a drill ends with its last call
        text = tokenizer.decode(ids[:n])
        ref_ids, ref_mask = _reference(tokenizer, text)
        assert ids[: len(ref_ids)] == ref_ids and mask[: len(ref_mask)] == ref_mask
        assert not any(mask[len(ref_mask) :])  # the padding carries no loss
        notes = re.findall(r'<tool_response>[^"]*"(\w+)" to the file "(\w+)\.txt"\. Then', text)
        drawn = [w for note in notes for w in note]
        assert len(set(drawn)) == 2 * NOTES and set(drawn) <= set(drills.words)
        delegated.add(text.count("Write the word", 0, text.index("Delegate")))
        compacted.add(text[: text.index("Summarise")].count("<tool_response>"))
    assert len(delegated) > 1 and len(compacted) > 1  # the shapes vary
    again, _ = drills.batch(random.Random(0))
    other, _ = drills.batch(random.Random(1))
    assert torch.equal(again, ids_BS) and not torch.equal(other, ids_BS)


def test_bad_steps_are_refused(tokenizer) -> None:
    with pytest.raises(ValueError, match="steps=0"):
        copy_pretrain(build_model(ModelConfig(), 1024), tokenizer, 0, seed=0)
    with pytest.raises(ValueError, match="copy_pretrain_steps=-1"):
        WarmStartConfig(copy_pretrain_steps=-1)


def test_copy_pretraining_lowers_the_loss_on_its_drills(tokenizer) -> None:
    model = build_model(ModelConfig(seed=0), 1024).train()
    lines: list[str] = []
    losses = copy_pretrain(model, tokenizer, 4, seed=0, log=lines.append)
    # a random model: about ln(1024) = 6.9 nats a token
    assert len(losses) == 4 and 6.5 < losses[0] < 7.5 and losses[-1] < losses[0], losses
    assert lines == [f"copy pretraining step {i}/4 loss {x:.3f}" for i, x in enumerate(losses, 1)]


def test_copy_pretraining_stops_once_its_loss_has_converged(tokenizer, monkeypatch) -> None:
    import gyre.model.copy_pretrain as copy_module

    monkeypatch.setattr(copy_module, "COPY_DONE_WINDOW", 3)
    monkeypatch.setattr(copy_module, "COPY_DONE_LOSS", 100.0)  # any loss counts as converged
    lines: list[str] = []
    model = build_model(ModelConfig(seed=0), 1024).train()
    losses = copy_pretrain(model, tokenizer, 50, seed=0, log=lines.append)
    assert len(losses) == 3 and lines[-1].endswith("(converged)") and "step 3/50" in lines[-1]


@pytest.mark.slow
def test_the_warm_start_pretrains_first_and_records_it(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    settings = WarmStartConfig(examples=6, epochs=1, batch_size=3, copy_pretrain_steps=3)
    out = warm_start(tiny_model_dir, tmp_path / "out", settings)
    record = msgspec.json.decode((out / SFT_RECORD).read_bytes(), type=SFTResult)
    assert len(record.copy_pretrain_losses) == 3 and len(record.losses) == 2
    plain = warm_start(
        tiny_model_dir, tmp_path / "plain", msgspec.structs.replace(settings, copy_pretrain_steps=0)
    )
    assert (out / "model.safetensors").read_bytes() != (plain / "model.safetensors").read_bytes()
    assert (
        msgspec.json.decode((plain / SFT_RECORD).read_bytes(), type=SFTResult).copy_pretrain_losses
        == []
    )
