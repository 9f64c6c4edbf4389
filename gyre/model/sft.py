"""Warm start: supervised fine-tuning of a model on the `learnable` or `learnable-long` suite's
demonstrations.

Owns `warm_start` (base model folder + `WarmStartConfig` -> fine-tuned folder, cached by a hash of
its inputs), `SFTResult` (what it records, `SFT_RECORD`), `output_dir` and `check_output_dir`.
The demonstrations and their token IDs come from `gyre.model.demonstrations`, the optional copy
pretraining before them from `gyre.model.copy_pretrain`; the quick check of the result is
`gyre.model.offline_eval`. Knows nothing about engines, the proxy or RL; plain
torch AdamW in float32 on one process.

Measured on the default tiny model (2 layers, hidden 128), held-out = the 32 shipped `learnable`
tasks, greedy / T=1 pass rate: 32 steps of 16: 0%; 64 of 16: 0% (call format learned, word and
path guessed: loss plateaus at ~0.10 nats/token, the no-copy floor); 128 of 4: 0%; 384 of 4:
6% / 0% (path copied, word not); 512 of 4: 0% / 2%; 384 of 8 (1 epoch): 22% / 17%, mean
reward 0.44 / 0.38 (half credit for the right file); on the suite's last 8 tasks (words of 4-5
tokens) 0% / 6%, on its first 24 21% at T=1. That run: 264 CPU s, 250 s wall on a shared 2-core
machine; byte-identical weights across runs. Second round (the loop's 8 held-out tasks x 16 at T=1
/ all 32 greedy / all 32 x 4 at T=1): 384 of 8 at 5e-3: 20% / 22% / 19%, first calls at T=1
right format 127/128, wrong word 94/128, wrong path 41/128 (the word is guessed among the
suite's words, e.g. blue -> stone); 384 of 8 at 1e-2: 0% / 0% / 1% (stuck at the no-copy floor,
final loss 0.09); 768 of 8 at 5e-3 (2 epochs, the default): 65% / 72% / 69%, final loss 0.007,
615 CPU s; its failures are half-copied words (pearl -> apearl, house -> housic) 23/128 and
wrong paths 16/128. With a slipping teacher (`slip_fraction` 0.4; the loop's 8 held-out tasks x
32 first calls at T=1, word and path judged without the stop): 768 of 8 at 5e-3: path right
100%, word 26%, stop 43%; 1152 of 8 at 3e-3: path 62%, word 94%, stop 43%; 1536 of 8 at 3e-3
(4 epochs, `examples/cpu.toml`): path and word 256/256, stop 33%, so a pass rate of 67% that
only the habit holds down; 184 s wall. At `slip_fraction` 0.6 (`examples/cpu.toml`) the same
1536 steps leave held-out pass rates of 38-55% before RL (3 loop seeds, 64 executions each).
`learnable-long` chains (`suite`; about 4 conversations a chain, each with the 776-token system
prompt and tools; batches of one kind, that prefix forwarded once): 160 chains x 3 epochs at 5e-3
(240 steps of 8, final loss 0.0015; 1101 s at load 6-20, 0.2 s a step when the machine is quiet)
and 480 x 1 (240 steps, loss 0.13) learn the chain's format (read, write or delegate, the
summary, finish) but not to copy the note's word into the call (held-out greedy: `stone` for
`maple`, `ligar` for `tiger`): held-out pass rate 0% on the real engines, so RL has no reward.
Longer (2026-12-04, `offline_chain_eval` on the suite's first 12 chains, greedy / 2 x T=1, pass
rate and mean reward): 960 chains x 2 epochs at 3e-3 (960 steps, final loss 0.064, 1833 s on a
loaded machine): 0% / 0%, reward 0.00 / 0.03; `learnable` first (3072 x 4 at 3e-3, slip 0, 1536
steps, which alone copies the instruction's word and path) then the 240 chain steps above:
0% / 0%, reward 0.04 / 0.03. Both keep the format (11-12 calls, delegate, compaction, finish)
and write a word of an earlier note or a wrong file (`cloud` to `a.txt` for `answer.txt`): the
2-layer, 128-wide model does not pick the latest of several similar notes in a chain.
Then (same check, a trailing full stop allowed, mean reward greedy / 4 x T=1; the form changes
tried on a scratch copy of the suite, not shipped): word and file quoted in the notes (the same
tokens as in the call's JSON), 240 steps: 0.02 / 0.01, 960 steps: 0.04 / 0.03; demonstrations
with random 3-6 letter words (a guess cannot lower the loss), 960 steps: 0.00 / 0.00; a
compaction before every write (`--compact-chars 800`: one note in context), 600 steps: 0.02 /
0.00, after `learnable`'s 1536: 0.04 / 0.01, both with the format broken (about 4 calls);
4 layers x 256 on random words: loss still about 0.45 a step at 768 steps (stopped). So the recipe
does not learn to copy from a tool result in a chain's context at all within about 2,500 steps,
one note in context or four. 240 chain steps take 37 s on a quiet machine.
The cause was the words (2026-12-04, same check, no slip): the tiny tokenizer spells `maple` as
` m a pl e` in a note and `m a pl e` after the call's quote, so a write meant spelling a word out
of other tokens. With words and file stems that are one token in both places, quoted in the note
(`learnable_long.WORDS`, `FILES`), chains alone still left the word guessed at 240, 960 and 2,000
steps (log p about -ln 16 on the word), and so did 1,500 steps of copy pretraining
(`gyre.model.copy_pretrain`, 125 s) followed by 240 chain steps at 5e-3 or 1e-3. Copy pretraining
followed by 2,000 chain steps (1,000 chains x 4 epochs at 5e-3, 422 s on a loaded machine) follows
held-out notes: mean reward 0.875 greedy / 0.90 at T=1, pass rate 58% / 62%, every execution in
the chain's format (12 calls, a delegation, a compaction, finish). That run was lucky: the same
recipe with the copy data drawn from another seed (`seed` 1) stayed at the guessing plateau
(chain loss about 0.065 a token) through 2,000 steps three times (800 or 1,500 copy steps, slip
0.6 or 0; 719 s for 1,500 + 2,000 on a quiet machine). Continuing one of them for 2,000 more
steps (slip 0), its loss left the plateau after about 1,400 of them (0.065 -> 0.023) and it
copies in part: held-out mean reward 0.27 greedy, pass rate 0%. So copying is learnable here,
but when it emerges within a few thousand steps is chance.
What made it reliable (2026-12-05): copy pretraining on drills shaped like the task
(`gyre.model.copy_pretrain`: notes as tool results, each followed by its call, words drawn from 189
rather than 16, so a guess costs 5.2 nats and only copying lowers the loss). The drills' loss sat
at the guessing floor (0.34) and fell to 0.002-0.004 after 330-480 steps in 6 of 6 runs (three
drill formats, two seeds; 0.3-0.55 s a step). Alone, a model drilled this way follows only short
contexts (held-out chains: the words guessed); 240 chain steps after it at 5e-3 lose the copying
again (mean reward 0.00), at 1e-3 they keep it: 75% held-out pass rate greedy, mean reward 0.90,
without the slip. With the slip (0.6) every word and file is copied (teacher-forced log p above
-0.5 on each), the sub-agent's file once the drills' loss reaches about 0.003 (at 0.037 it was
still guessed, log p about -2.6), and the one remaining error is the habit: the closing quote after
a word at log p -0.7 to -1.0 against the full stop, so greedy decoding writes `word.` and passes
nothing (`examples/cpu.toml`'s warm start, what RL has to fix).

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
