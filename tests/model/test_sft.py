"""Warm start: demonstrations encoded as the agent's calls, exact shared-prefix packing, caching."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import msgspec
import pytest
import torch

from gyre.agents.oracle import demonstration_for
from gyre.agents.tools import SYSTEM_PROMPT, TOOL_SCHEMAS
from gyre.config import WarmStartConfig
from gyre.model.__main__ import main
from gyre.model.demonstrations import demonstrations, encode_conversation
from gyre.model.offline_eval import offline_pass_rate
from gyre.model.sft import SFT_RECORD, SFTResult, _packed_loss, output_dir, warm_start
from gyre.tasks.suites import SUITES, learnable_examples

TINY = WarmStartConfig(examples=6, batch_size=3, epochs=1, warmup_steps=1)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_encoding_is_the_agents_prompt_plus_generated_turns(tokenizer) -> None:
    ((instruction, solution),) = learnable_examples(1, seed=3)
    demo = demonstration_for(instruction, solution)
    enc = encode_conversation(tokenizer, demo["messages"], demo["tools"])
    args = json.loads(demo["messages"][2]["tool_calls"][0]["function"]["arguments"])
    # the tokens before the first loss token are the agent's first request, rendered as the proxy
    # does
    first_prompt = tokenizer.apply_chat_template(
        [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": instruction}],
        tools=TOOL_SCHEMAS,
        tokenize=False,
        add_generation_prompt=True,
    )
    k = enc.loss_mask.index(True)
    assert enc.ids[:k] == tokenizer.encode(first_prompt, add_special_tokens=False)
    # loss tokens are exactly the two completions, each ending with <|im_end|>
    runs, current = [], []
    for tok, m in zip(enc.ids, enc.loss_mask):
        if m:
            current.append(tok)
        elif current:
            runs.append(current)
            current = []
    runs.append(current)
    assert [tokenizer.decode(r) for r in runs] == [
        f'<tool_call>{{"name": "write_file", "arguments": {{"path": "{args["path"]}", '
        f'"content": "{args["content"]}"}}}}'
        "</tool_call><|im_end|>",
        '<tool_call>{"name": "finish", "arguments": {"summary": "done"}}</tool_call><|im_end|>',
    ]
    assert all(r[-1] == tokenizer.eos_token_id for r in runs)
    # all tokens together are the whole conversation as the template renders it
    full = tokenizer.apply_chat_template(demo["messages"], tools=demo["tools"], tokenize=False)
    assert tokenizer.decode(enc.ids) == full.removesuffix("\n")


def test_demonstrations_hold_the_shipped_suite_out() -> None:
    settings = WarmStartConfig(examples=100, seed=1)
    demos = demonstrations(settings)
    shipped = {t.instruction for t in SUITES["learnable"](0)}
    instructions = [d["messages"][1]["content"] for d in demos]
    assert len(demos) == 100 and not shipped & set(instructions)
    drawn = [i for i, _ in learnable_examples(200, seed=1)]
    assert shipped & set(drawn)  # the raw draw does hit shipped tasks: the filter is doing work
    assert demonstrations(settings) == demos


def test_a_slipping_teacher_ends_the_word_with_a_full_stop() -> None:
    clean = demonstrations(WarmStartConfig(examples=200, seed=1))
    slipped = demonstrations(WarmStartConfig(examples=200, seed=1, slip_fraction=0.4))
    draws = random.Random("slip")
    expected = [draws.random() < 0.4 for _ in range(200)]  # one draw per demonstration, in order
    assert 60 <= sum(expected) <= 100
    for want_slip, c, s in zip(expected, clean, slipped, strict=True):
        assert s["messages"][:2] == c["messages"][:2]  # same task
        written = json.loads(s["messages"][2]["tool_calls"][0]["function"]["arguments"])
        word = json.loads(c["messages"][2]["tool_calls"][0]["function"]["arguments"])["content"]
        assert written["content"] == (word + "." if want_slip else word)
        # the oracle ran the slipped call, so the tool result tells the truth
        assert (
            s["messages"][3]["content"]
            == f"wrote {len(written['content'])} characters to {written['path']}"
        )
        assert s["messages"][4:] == c["messages"][4:]  # then finish, as before
    with pytest.raises(ValueError, match="slip_fraction=1"):
        WarmStartConfig(slip_fraction=1.0)


def test_packed_loss_equals_separate_forwards(tiny_model_dir: Path, tokenizer) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        tiny_model_dir, dtype=torch.float64, attn_implementation="sdpa"
    )
    batch = [
        encode_conversation(tokenizer, d["messages"], d["tools"]) for d in demonstrations(TINY)[:3]
    ]
    prefix = (
        batch[0].loss_mask.index(True) - 20
    )  # inside the instruction: suffixes differ in length
    packed, tokens = _packed_loss(model, batch, prefix)
    nll, count = torch.zeros((), dtype=torch.float64), 0
    for ex in batch:
        logits = model(input_ids=torch.tensor(ex.ids)[None]).logits[0, :-1]
        lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ex.ids[1:])[:, None])[:, 0]
        mask = torch.tensor(ex.loss_mask[1:])
        nll -= lp[mask].sum()
        count += int(mask.sum())
    assert tokens == prefix + sum(len(e.ids) - prefix for e in batch)
    assert packed.item() == pytest.approx((nll / count).item(), rel=1e-9)


def digest(path: Path) -> str:
    return hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()


def test_a_change_to_the_recipes_code_is_a_new_input(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch
) -> None:
    from gyre.model import sft

    demos = demonstrations(TINY)
    before = sft._hash_inputs(tiny_model_dir, TINY, demos)
    copies = []
    for path in sft._RECIPE_FILES:
        copies.append(tmp_path / path.name)
        copies[-1].write_bytes(path.read_bytes())
    monkeypatch.setattr(sft, "_RECIPE_FILES", tuple(copies))
    assert sft._hash_inputs(tiny_model_dir, TINY, demos) == before
    for copy in copies:  # an edit to any of them, e.g. the copy drills' or the optimizer's
        text = copy.read_bytes()
        copy.write_bytes(text + b"# changed\n")
        assert sft._hash_inputs(tiny_model_dir, TINY, demos) != before, copy.name
        copy.write_bytes(text)


@pytest.mark.slow
def test_warm_start_trains_caches_and_is_deterministic(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    lines: list[str] = []
    out = warm_start(tiny_model_dir, tmp_path / "a", TINY, log=lines.append)
    record = msgspec.json.decode((out / SFT_RECORD).read_bytes(), type=SFTResult)
    assert (record.steps, record.demonstrations, record.settings) == (2, 6, TINY)
    assert len(record.losses) == 2 and all(x > 0 for x in record.losses)
    assert digest(out) != digest(tiny_model_dir)
    assert {"tokenizer.json", "config.json", "gyre_model.json"} <= {p.name for p in out.iterdir()}
    mtime = (out / "model.safetensors").stat().st_mtime_ns
    assert warm_start(tiny_model_dir, out, TINY, log=lines.append) == out  # cached
    assert (out / "model.safetensors").stat().st_mtime_ns == mtime
    assert lines[-1].startswith(f"warm start: {out} is up to date")
    again = warm_start(tiny_model_dir, tmp_path / "b", TINY)
    assert digest(again) == digest(out)  # same inputs, same weights
    other = msgspec.structs.replace(TINY, learning_rate=1e-4)
    assert digest(warm_start(tiny_model_dir, out, other)) != digest(again)  # stale output replaced
    assert msgspec.json.decode((out / SFT_RECORD).read_bytes(), type=SFTResult).settings == other


def test_warm_start_errors(tiny_model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        warm_start(tmp_path / "missing", tmp_path / "out", TINY)
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="holds no gyre_sft.json"):
        warm_start(tiny_model_dir, tmp_path / "foreign", TINY)
    with pytest.raises(ValueError, match="examples=0"):
        WarmStartConfig(examples=0)
    with pytest.raises(ValueError, match="samples=0"):
        offline_pass_rate(
            tiny_model_dir, [("Write the word a to the file b.", "a", "b")], samples=0
        )


@pytest.mark.slow
def test_cli_trains_then_reuses(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "sft",
        "--model",
        str(tiny_model_dir),
        "--out",
        str(tmp_path / "o"),
        "--examples",
        "4",
        "--lr",
        "1e-3",
    ]
    assert main(argv) == 0
    assert (
        "2 steps, final loss" in capsys.readouterr().out
    )  # 4 examples: one batch of 8 per epoch, 2 epochs
    assert main(argv) == 0
    assert "is up to date" in capsys.readouterr().out
    run = tmp_path / "run.toml"  # a run's [warm_start] is reproduced; a flag overrides it
    run.write_text("[warm_start]\nexamples = 4\nepochs = 1\nlearning_rate = 2e-3\n")
    assert (
        main(
            [
                "sft",
                "--model",
                str(tiny_model_dir),
                "--out",
                str(tmp_path / "c"),
                "--config",
                str(run),
                "--lr",
                "1e-3",
            ]
        )
        == 0
    )
    assert "1 steps, final loss" in capsys.readouterr().out
    record = msgspec.json.decode((tmp_path / "c" / SFT_RECORD).read_bytes(), type=SFTResult)
    assert (record.settings.examples, record.settings.epochs, record.settings.learning_rate) == (
        4,
        1,
        1e-3,
    )


def test_cli_errors(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["sft", "--model", str(tmp_path / "nope"), "--out", str(tmp_path / "o2")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert (
        main(
            ["sft", "--model", str(tiny_model_dir), "--out", str(tmp_path / "o3"), "--epochs", "0"]
        )
        == 2
    )
    assert "epochs=0" in capsys.readouterr().err
    assert (
        main(
            [
                "sft",
                "--model",
                str(tiny_model_dir),
                "--out",
                str(tmp_path / "o4"),
                "--slip-fraction",
                "1",
            ]
        )
        == 2
    )
    assert "slip_fraction=1.0 must be in [0, 1)" in capsys.readouterr().err
    assert not (tmp_path / "o4").exists()
    out = str(tmp_path / "o6")
    argv = ["sft", "--model", str(tiny_model_dir), "--out", out, "--copy-pretrain-steps", "-2"]
    assert main(argv) == 2
    assert "copy_pretrain_steps=-2 must be >= 0" in capsys.readouterr().err
    (tmp_path / "file").write_text("not a folder")
    assert main(["sft", "--model", str(tiny_model_dir), "--out", str(tmp_path / "file")]) == 2
    assert "exists and is not a folder" in capsys.readouterr().err
    bad = tmp_path / "bad.toml"
    bad.write_text("[warm_start]\nepochs = -1\n")
    assert (
        main(
            [
                "sft",
                "--model",
                str(tiny_model_dir),
                "--out",
                str(tmp_path / "o5"),
                "--config",
                str(bad),
            ]
        )
        == 2
    )
    assert "epochs=-1 must be > 0" in capsys.readouterr().err
    assert main(["init", str(tmp_path / "file")]) == 2
    assert "exists and is not a folder" in capsys.readouterr().err


def test_output_dir() -> None:
    assert output_dir("runs/model-tiny/", WarmStartConfig()) == Path("runs/model-tiny-sft")
    assert output_dir("runs/model-tiny", WarmStartConfig(path="elsewhere/sft")) == Path(
        "elsewhere/sft"
    )
