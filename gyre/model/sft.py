"""Warm start: supervised fine-tuning of a model on the `learnable` or `learnable-long` suite's
demonstrations.

Owns `warm_start` (base model folder + `WarmStartConfig` -> fine-tuned folder, cached by a hash of
its inputs), `SFTResult` (what it records, `SFT_RECORD`), `output_dir` and `check_output_dir`.
The demonstrations and their token IDs come from `gyre.model.demonstrations`, the optional copy
pretraining before them from `gyre.model.copy_pretrain`; the quick check of the result is
`gyre.model.offline_eval`. Knows nothing about engines, the proxy or RL; plain
torch AdamW in float32 on one process.

The kept recipe is `examples/cpu.toml`'s `[warm_start]` (copy pretraining, then whole chains at
1e-3 from a teacher that slips); the recipes tried and what each left: `docs/notes/warm-start.md`.

Shape suffix legend: `T` packed tokens, `N` loss positions, `H` hidden size.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from gyre.config import WarmStartConfig
from gyre.model.copy_pretrain import copy_pretrain
from gyre.model.demonstrations import Encoded, demonstrations, encode_conversation

__all__ = ["SFT_RECORD", "SFTResult", "warm_start", "check_output_dir", "output_dir"]

SFT_RECORD = "gyre_sft.json"
"""File in the output folder: the input hash, settings, losses and wall time of the fine-tune."""
_RECIPE_FILES = tuple(
    Path(__file__).with_name(n) for n in ("sft.py", "copy_pretrain.py", "demonstrations.py")
)
"""The modules of this package that decide what a warm start trains on and how: their bytes are
part of the input hash, so changing any of them rebuilds cached outputs (no version to bump)."""
_WEIGHT_FILES = ("model.safetensors",)


class SFTResult(msgspec.Struct, frozen=True, kw_only=True):
    """What `warm_start` recorded in `<out>/gyre_sft.json`."""

    input_hash: str
    """sha256 of (the recipe's modules, base model files, settings, demonstrations)."""
    settings: WarmStartConfig
    base_model: str
    demonstrations: int
    steps: int
    """Optimizer steps taken."""
    losses: list[float]
    """Mean loss per assistant token (nats) of every step."""
    copy_pretrain_losses: list[float] = []
    """Mean loss per token (nats) of every copy-pretraining step before them (none when
    `settings.copy_pretrain_steps` is 0)."""
    tokens_per_step: float
    """Mean tokens forwarded per step, the shared prompt prefix counted once (`learnable-long`:
    plus rows x the longest rest, padding included)."""
    wall_s: float
    """Seconds spent training (demonstrations, encoding and saving included)."""
    cpu_s: float
    """CPU seconds of this process over the same span (all threads; robust to other load)."""


def _common_prefix(seqs: Sequence[Sequence[int]]) -> int:
    n = min(len(s) for s in seqs)
    first = seqs[0]
    for k in range(n):
        if any(s[k] != first[k] for s in seqs):
            return k
    return n


def _packed_loss(model: Any, batch: list[Encoded], prefix_len: int):
    """Mean NLL (nats) over the batch's loss tokens, with the shared prompt prefix forwarded once.

    The packed sequence is `prefix + suffix_1 + ... + suffix_B` (DFS order of a one-level tree);
    each suffix attends to the prefix and to itself (`gyre.kernels.tree_attention.tree_mask`),
    with position IDs continuing the prefix. Equal to the mean over separate forwards.
    """
    import torch
    import torch.nn.functional as F

    from gyre.kernels.tree_attention import tree_mask

    p = prefix_len
    ids: list[int] = list(batch[0].ids[:p])
    pos: list[int] = list(range(p))
    parents: list[int] = []
    labels: list[int] = []
    spans: list[tuple[int, int]] = []
    for ex in batch:
        start = len(ids)
        suffix = ex.ids[p:]
        ids += suffix
        pos += range(p, p + len(suffix))
        spans.append((start, len(ids)))
        for j, (tok, m) in enumerate(zip(ex.ids, ex.loss_mask)):
            if m:
                assert j >= p and j > 0, "loss tokens lie after the shared prefix"
                parents.append(start + j - p - 1 if j > p else p - 1)
                labels.append(tok)
    total = len(ids)
    dfs_out_T = [total] * p
    for start, end in spans:
        dfs_out_T += [end] * (end - start)
    mask = tree_mask(torch.tensor(dfs_out_T))[None, None]
    hidden_TH = model.model(
        input_ids=torch.tensor(ids)[None],
        attention_mask=mask,
        position_ids=torch.tensor(pos)[None],
        use_cache=False,
    ).last_hidden_state[0]
    logits_NV = model.lm_head(hidden_TH[torch.tensor(parents)])
    return F.cross_entropy(logits_NV, torch.tensor(labels)), total


def _cached_prefix_loss(model: Any, batch: list[Encoded], prefix_len: int):
    """Mean NLL (nats) over the batch's loss tokens: the shared prompt prefix forwarded once, its
    K/V repeated for each conversation (in the autograd graph), each conversation's rest on its
    own row, right-padded to the longest (causal attention over prefix + row: no real token sees
    the padding). Equal to the mean over separate forwards; for long conversations, where the
    packed tree's T x T mask grows with the square of the whole batch, this grows with one row's.
    `prefix_len` must lie before every loss token's predecessor (< first loss index)."""
    import torch
    import torch.nn.functional as F

    p = prefix_len
    assert p >= 1, "a shared prefix of at least one token"
    cache = model.model(input_ids=torch.tensor(batch[0].ids[:p])[None], use_cache=True)
    cache = cache.past_key_values
    cache.batch_repeat_interleave(len(batch))
    width = max(len(ex.ids) for ex in batch) - p
    ids_BS = torch.zeros(len(batch), width, dtype=torch.long)
    rows: list[int] = []
    cols: list[int] = []
    labels: list[int] = []
    for b, ex in enumerate(batch):
        ids_BS[b, : len(ex.ids) - p] = torch.tensor(ex.ids[p:])
        for j, m in enumerate(ex.loss_mask):
            if m:
                assert j - 1 >= p, "loss tokens lie after the shared prefix"
                rows.append(b)
                cols.append(j - 1 - p)
                labels.append(ex.ids[j])
    position_ids_BS = torch.arange(p, p + width)[None].expand(len(batch), width)
    hidden_BSH = model.model(
        input_ids=ids_BS, past_key_values=cache, position_ids=position_ids_BS, use_cache=True
    ).last_hidden_state
    logits_NV = model.lm_head(hidden_BSH[torch.tensor(rows), torch.tensor(cols)])
    return F.cross_entropy(logits_NV, torch.tensor(labels)), p + len(batch) * width


def _batches(encoded: list[Encoded], size: int, rng: random.Random, end_id: int) -> list[list[int]]:
    """One epoch's batches for long conversations: conversations with the same first message (up
    to the first `end_id`: system prompt and tools) batched together so they share a long prefix,
    batches shuffled."""
    kinds: dict[tuple[int, ...], list[int]] = {}
    for i, ex in enumerate(encoded):
        first = ex.ids.index(end_id) if end_id in ex.ids else len(ex.ids)
        kinds.setdefault(tuple(ex.ids[:first]), []).append(i)
    out: list[list[int]] = []
    for key in sorted(kinds):
        members = kinds[key]
        rng.shuffle(members)
        out += [members[k : k + size] for k in range(0, len(members), size)]
    rng.shuffle(out)
    return out


def _hash_inputs(model_dir: Path, settings: WarmStartConfig, demos: list[dict]) -> str:
    h = hashlib.sha256()
    for path in _RECIPE_FILES:
        h.update(hashlib.sha256(path.read_bytes()).digest())
    for path in sorted(p for p in model_dir.rglob("*") if p.is_file()):
        if path.name == SFT_RECORD:
            continue
        h.update(str(path.relative_to(model_dir)).encode() + b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())
    # where the output goes and whether the caller uses it do not change the weights
    h.update(msgspec.json.encode(msgspec.structs.replace(settings, enabled=True, path="")))
    h.update(json.dumps(demos, sort_keys=True).encode())
    return h.hexdigest()


def _cached(out_dir: Path, input_hash: str) -> bool:
    record = out_dir / SFT_RECORD
    if not record.is_file():
        return False
    try:
        return msgspec.json.decode(record.read_bytes(), type=SFTResult).input_hash == input_hash
    except (msgspec.DecodeError, msgspec.ValidationError):
        return False


def check_output_dir(out_dir: str | os.PathLike[str]) -> None:
    """Raise `FileExistsError` unless `out_dir` is missing, empty, or a warm-start output (holds
    `SFT_RECORD`): `warm_start` replaces a stale output but never someone else's files."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise FileExistsError(f"{str(out_dir)!r} exists and is not a folder")
    if out_dir.exists() and any(out_dir.iterdir()) and not (out_dir / SFT_RECORD).is_file():
        raise FileExistsError(f"{str(out_dir)!r} exists, is not empty and holds no {SFT_RECORD}")


def warm_start(
    model_dir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    settings: WarmStartConfig = WarmStartConfig(),
    *,
    log=None,
) -> Path:
    """Fine-tune the model at `model_dir` on demonstrations; the result is a model folder `out_dir`.

    Steps: `ceil(examples / batch_size) * epochs`, each one AdamW update (float32, linear warm-up
    then cosine decay to 10% of `learning_rate`) on the mean loss over the assistant tokens of
    `batch_size` demonstrations. Deterministic for equal inputs and thread count. Cached: when
    `out_dir/gyre_sft.json` records the same input hash (base model files, settings,
    demonstrations, the recipe's modules), returns at once; a stale output is replaced atomically.

    Args:
        model_dir: a Hugging Face causal-LM folder with a chat template (e.g. `gyre.model init`).
        out_dir: where the fine-tuned folder goes (model, tokenizer, `gyre_sft.json`).
        settings: `WarmStartConfig` (its `enabled` and `path` are the caller's business).
        log: optional `callable(str)` for progress lines (about ten per run, and the outcome).
    Returns:
        `out_dir` as a Path.
    Raises:
        FileNotFoundError: `model_dir` is not a folder.
        FileExistsError: `out_dir` is a file, or a non-empty folder that is not a warm-start output.
    """
    t0, c0 = time.perf_counter(), time.process_time()
    model_dir = Path(model_dir)
    out_dir = Path(out_dir)
    if not model_dir.is_dir():
        raise FileNotFoundError(f"model folder {str(model_dir)!r} does not exist")
    check_output_dir(out_dir)
    demos = demonstrations(settings)
    input_hash = _hash_inputs(model_dir, settings, demos)
    if _cached(out_dir, input_hash):
        if log is not None:
            log(f"warm start: {out_dir} is up to date (inputs {input_hash[:12]})")
        return out_dir

    import torch

    threads = torch.get_num_threads()  # all cores while training, the caller's setting after
    torch.set_num_threads(os.cpu_count() or 1)
    try:
        model, result = _train(model_dir, settings, demos, input_hash, log)
    finally:
        torch.set_num_threads(threads)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        for path in model_dir.iterdir():
            if path.is_file() and path.name not in _WEIGHT_FILES and path.name != SFT_RECORD:
                shutil.copy2(path, tmp / path.name)
        model.save_pretrained(tmp, safe_serialization=True)
        result = msgspec.structs.replace(
            result, wall_s=time.perf_counter() - t0, cpu_s=time.process_time() - c0
        )
        (tmp / SFT_RECORD).write_bytes(
            msgspec.json.format(msgspec.json.encode(result), indent=1) + b"\n"
        )
        if out_dir.exists():
            shutil.rmtree(out_dir)
        tmp.rename(out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    if log is not None:
        log(
            f"warm start: wrote {out_dir} ({result.steps} steps, "
            f"final loss {result.losses[-1]:.4f}, "
            f"{result.wall_s:.0f} s)"
        )
    return out_dir


def _train(model_dir: Path, settings: WarmStartConfig, demos: list[dict], input_hash: str, log):
    """The fine-tune itself: (model in eval mode, SFTResult without times)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    encoded = [
        encode_conversation(tokenizer, d["messages"], d["tools"], last_only=d.get("loss") == "last")
        for d in demos
    ]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(settings.seed)
        model = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch.float32, attn_implementation="sdpa"
        )
        model.train()
        copy_losses = (
            copy_pretrain(
                model, tokenizer, settings.copy_pretrain_steps, seed=settings.seed, log=log
            )
            if settings.copy_pretrain_steps
            else []
        )
        opt = torch.optim.AdamW(
            model.parameters(),
            lr=settings.learning_rate,
            weight_decay=settings.weight_decay,
            betas=(0.9, 0.95),
        )
        rng = random.Random(f"{settings.seed}:sft-order")
        end_id = tokenizer.eos_token_id
        if settings.suite == "learnable":
            per_epoch = math.ceil(len(encoded) / settings.batch_size)
        else:
            per_epoch = len(_batches(encoded, settings.batch_size, random.Random(0), end_id))
        total_steps = per_epoch * settings.epochs
        losses: list[float] = []
        tokens = 0
        step = 0
        for _ in range(settings.epochs):
            if settings.suite == "learnable":
                order = list(range(len(encoded)))
                rng.shuffle(order)
                size = settings.batch_size
                epoch = [order[b * size : (b + 1) * size] for b in range(per_epoch)]
            else:
                epoch = _batches(encoded, settings.batch_size, rng, end_id)
            for indices in epoch:
                batch = [encoded[i] for i in indices]
                prefix = min(
                    _common_prefix([e.ids for e in batch]),
                    *(e.loss_mask.index(True) for e in batch),
                )
                lr = _lr(step, total_steps, settings)
                for group in opt.param_groups:
                    group["lr"] = lr
                if settings.suite == "learnable":
                    loss, packed = _packed_loss(model, batch, prefix)
                else:
                    loss, packed = _cached_prefix_loss(model, batch, max(prefix - 1, 1))
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                losses.append(loss.item())
                tokens += packed
                step += 1
                if log is not None and (
                    step % max(total_steps // 10, 1) == 0 or step == total_steps
                ):
                    log(f"sft step {step}/{total_steps} loss {losses[-1]:.4f} lr {lr:.2e}")
        model.eval()
    return model, SFTResult(
        input_hash=input_hash,
        settings=settings,
        base_model=str(model_dir),
        demonstrations=len(demos),
        steps=step,
        losses=losses,
        copy_pretrain_losses=copy_losses,
        tokens_per_step=tokens / max(step, 1),
        wall_s=0.0,
        cpu_s=0.0,
    )


def output_dir(model_path: str | os.PathLike[str], settings: WarmStartConfig) -> Path:
    """Where a run's warm-started model goes: `settings.path`, or `<model_path>-sft` when empty."""
    return (
        Path(settings.path) if settings.path else Path(f"{os.fspath(model_path).rstrip('/')}-sft")
    )


def _lr(step: int, total: int, s: WarmStartConfig) -> float:
    if step < s.warmup_steps:
        return s.learning_rate * (step + 1) / s.warmup_steps
    span = max(total - s.warmup_steps, 1)
    frac = min((step - s.warmup_steps) / span, 1.0)
    return s.learning_rate * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
