"""The reference tiny model: deterministic, loads in transformers, and its template renders
ChatML."""

from __future__ import annotations

import hashlib

import pytest
import torch

from gyre.config import ModelConfig
from gyre.model import TAG_TOKENS, build_tokenizer, init_model_dir
from gyre.model.behaviour_logprobs import completion_logprobs, sampling_logprobs


def digest(path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir())}


def test_same_seed_gives_identical_files_other_seed_differs(tmp_path) -> None:
    a = init_model_dir(tmp_path / "a", ModelConfig(seed=5))
    b = init_model_dir(tmp_path / "b", ModelConfig(seed=5))
    c = init_model_dir(tmp_path / "c", ModelConfig(seed=6))
    assert digest(a) == digest(b)
    assert digest(a)["model.safetensors"] != digest(c)["model.safetensors"]


def test_refuses_to_overwrite(tmp_path, tiny_model_dir) -> None:
    with pytest.raises(FileExistsError, match="exists and is not empty"):
        init_model_dir(tiny_model_dir)


def test_loads_in_transformers_with_configured_shape(tiny_model_dir) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    cfg = ModelConfig()
    assert (
        model.config.hidden_size == cfg.hidden_size
        and model.config.num_hidden_layers == cfg.num_hidden_layers
    )
    assert model.config.hidden_size // model.config.num_attention_heads >= 32  # vLLM CPU attention
    assert model.config.vocab_size == len(tok) <= cfg.vocab_size
    assert tok.eos_token == "<|im_end|>" and tok.bos_token is None


def test_every_byte_round_trips_and_tags_are_single_tokens() -> None:
    tok = build_tokenizer(1024, seed=0)
    text = "héllo wörld ✓ 日本 \x00\x7f tabs\tand\nnewlines"
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    for tag in TAG_TOKENS:
        ids = tok.encode(tag, add_special_tokens=False)
        assert len(ids) == 1 and tok.decode(ids) == tag


def test_chat_template_renders_tools_reasoning_and_results(tiny_model_dir) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    messages = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "add 2 and 3"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "need tool",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "5"},
    ]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nsys<|im_end|>\n"
        "<|im_start|>user\nadd 2 and 3<|im_end|>\n"
        "<|im_start|>assistant\n<think>need tool</think>\n"
        '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call><|im_end|>\n'
        "<|im_start|>tool\n<tool_response>5</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    dict_args = [
        dict(
            messages[2],
            tool_calls=[
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "add", "arguments": {"a": 2, "b": 3}},
                }
            ],
        )
    ]
    rendered = tok.apply_chat_template(dict_args, tokenize=False)
    assert '"arguments": {"a": 2, "b": 3}}' in rendered
    with_tools = tok.apply_chat_template(
        messages[:2], tools=[{"type": "function", "function": {"name": "add"}}], tokenize=False
    )
    assert (
        with_tools.startswith("<|im_start|>system\nsys\n\n# Tools\n")
        and '"name": "add"' in with_tools
    )


def test_b05_sampling_logprobs_after_temperature() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0]], dtype=torch.float64)
    lp = sampling_logprobs(logits, temperature=0.5)[0, 0].item()
    assert lp == pytest.approx(-0.14293, abs=1e-5)
    assert sampling_logprobs(logits)[0, 0].item() == pytest.approx(-0.40761, abs=1e-5)


def test_top_k_and_top_p_renormalise_over_kept_tokens() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]], dtype=torch.float64))
    top_k = sampling_logprobs(logits, top_k=2).exp()[0]
    assert top_k.tolist() == pytest.approx([0.625, 0.375, 0.0, 0.0])
    top_p = sampling_logprobs(logits, top_p=0.75).exp()[0]  # 0.5 + 0.3 covers 0.75: keep two
    assert top_p.tolist() == pytest.approx([0.625, 0.375, 0.0, 0.0])
    top_p = sampling_logprobs(logits, top_p=0.85).exp()[0]
    assert top_p.tolist() == pytest.approx([0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0.0])
    with pytest.raises(ValueError, match="top_p=0"):
        sampling_logprobs(logits, top_p=0)


def test_completion_logprobs_equal_manual_forward(tiny_model_dir) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64).eval()
    prompt, completion = [5, 6, 7, 8], [9, 10, 11]
    lps = completion_logprobs(model, prompt, completion, temperature=0.7)
    with torch.no_grad():
        for j, tok in enumerate(completion):
            logits = model(input_ids=torch.tensor([prompt + completion[:j]])).logits[0, -1]
            assert lps[j].item() == pytest.approx(
                torch.log_softmax(logits / 0.7, -1)[tok].item(), abs=1e-12
            )
