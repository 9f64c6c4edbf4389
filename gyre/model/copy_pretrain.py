"""Copy pretraining: drills that teach a freshly initialised model to copy a note's quoted word
and file name into the tool call after it, before the warm start's demonstrations.

Owns `copyable_words` (the words a tokenizer holds as one token wherever a chain quotes them),
`CopyDrills` (drill conversations as token IDs, drawn fast) and `copy_pretrain`. A real base model
arrives able to copy what its context says; the reference tiny model (`gyre.model.recipe`) is
random, and the `learnable-long` chains ask it to copy a word from a tool result. A drill is such
a chain cut down to what the copy needs (no system prompt, tool schemas, reads or tool replies):
the notes and the calls on them, one compaction and the sub-agent's write, encoded with
`gyre.model.demonstrations.encode_conversation`. Its words and file stems are drawn from every
`copyable_words` entry (189 for the tiny tokenizer), so a guess costs about ln 189 = 5.2 nats
and the loss only falls once the model looks back at the latest note.

The drills' loss sits at the guessing floor for some hundred steps, then falls once the model
copies (`docs/notes/warm-start.md`: the runs, and the drill data tried before). Knows nothing
about engines or RL.

Shape suffix legend: `B` rows per batch, `S` tokens per row.
"""

from __future__ import annotations

import itertools
import json
import random
from typing import Any

__all__ = ["COPY_ROWS", "COPY_LR", "CopyDrills", "copy_pretrain", "copyable_words"]

COPY_ROWS = 32
"""Drills per step."""
COPY_LR = 1e-3
"""Peak AdamW learning rate (50-step linear warm-up, then constant)."""
COPY_DONE_LOSS = 0.005
"""Copy pretraining stops early once its mean loss over the last `COPY_DONE_WINDOW` steps is
below this (nats a token): every call copied, the sub-agent's included. Measured on the tiny
model: about 0.34 while it guesses the words, 0.002-0.004 once it copies."""
COPY_DONE_WINDOW = 20
_WARMUP = 50


def copyable_words(tokenizer: Any) -> list[str]:
    """Lowercase alphabetic vocabulary entries of 3+ letters that the tokenizer keeps as one
    token wherever a `learnable-long` chain quotes a word or file stem: after the note's quote,
    inside the call's JSON, and inside a `delegate` call's escaped task. Sorted. The tiny
    tokenizer keeps 189, every `WORDS` entry and `FILES` stem among them.

    Raises:
        ValueError: fewer than 16 such words (a drill draws 4 words and 4 stems, distinct).
    """
    out = []
    for text in sorted({tokenizer.decode([i]) for i in tokenizer.get_vocab().values()}):
        if not (len(text) >= 3 and text.isalpha() and text.islower()):
            continue
        alone = tokenizer.encode(text, add_special_tokens=False)
        contexts = (
            f'Write the word "{text}" to the file "{text}.txt". Then',
            json.dumps({"path": f"{text}.txt", "content": text}),
            json.dumps({"task": f'Write the word "{text}" to the file "{text}.txt".'}),
        )
        if len(alone) == 1 and all(
            tokenizer.encode(c, add_special_tokens=False).count(alone[0]) >= 2 for c in contexts
        ):
            out.append(text)
    if len(out) < 16:
        raise ValueError(f"the tokenizer keeps only {len(out)} words whole in a chain (need 16)")
    return out


class CopyDrills:
    """Drills as token IDs and loss masks, drawn without re-rendering the chat template.

    A drill is a `learnable-long` chain's notes, each as a tool result followed by the call a
    perfect agent makes on it (`write_file`, or `delegate` for the delegated note), the history
    compacted once after a note is read (its summary is that note), then the sub-agent's prompt and
    its `write_file`; loss on the calls and the summary. Each of the 16 shapes (which note
    delegates, after which one the history is compacted) is rendered twice, with two disjoint sets
    of placeholder words; the positions where both renders hold their own placeholder are the slots,
    and a drill is the first render with its slots set to freshly drawn words (4 words and 4 file
    stems, distinct, from `copyable_words`).

    Raises:
        ValueError: from `copyable_words`, or a chat template that renders the placeholders
            in different numbers of tokens.
    """

    def __init__(self, tokenizer: Any) -> None:
        from gyre.tasks.suites.learnable_long import NOTES

        self.words = copyable_words(tokenizer)
        self._ids = [tokenizer.encode(w, add_special_tokens=False)[0] for w in self.words]
        k = 2 * NOTES
        first, second = self._ids[:k], self._ids[k : 2 * k]
        self._shapes = []  # per shape: (ids, loss_mask, positions of each slot)
        for delegated, compacted in itertools.product(range(NOTES), repeat=2):
            ids_a, mask = _render(tokenizer, self.words[:k], delegated, compacted)
            ids_b, _ = _render(tokenizer, self.words[k : 2 * k], delegated, compacted)
            if len(ids_a) != len(ids_b):
                raise ValueError("the chat template renders a drill's words in more tokens")
            slots = [
                [i for i, pair in enumerate(zip(ids_a, ids_b)) if pair == placeholders]
                for placeholders in zip(first, second, strict=True)
            ]
            self._shapes.append((ids_a, mask, slots))

    def batch(self, rng: random.Random, rows: int = COPY_ROWS):
        """`rows` drills as (ids_BS int64, loss_mask_BS bool), one per row, right-padded with
        token 0 (masked). Deterministic for an equal `rng` state."""
        import torch

        drills = []
        for _ in range(rows):
            ids, mask, slots = self._shapes[rng.randrange(len(self._shapes))]
            ids = list(ids)
            for positions, token in zip(slots, rng.sample(self._ids, len(slots)), strict=True):
                for i in positions:
                    ids[i] = token
            drills.append((ids, mask))
        width = max(len(ids) for ids, _ in drills)
        ids_BS = torch.zeros(rows, width, dtype=torch.long)
        mask_BS = torch.zeros(rows, width, dtype=torch.bool)
        for r, (ids, mask) in enumerate(drills):
            ids_BS[r, : len(ids)] = torch.tensor(ids)
            mask_BS[r, : len(mask)] = torch.tensor(mask)
        return ids_BS, mask_BS


def _render(
    tokenizer: Any, placeholders: list[str], delegated: int, compacted: int
) -> tuple[list, list]:
    """One drill as (token IDs, loss mask): each note of a chain as a tool result, then the call
    a perfect agent makes on it (`write_file`, or `delegate` for note `delegated`), with the
    history compacted after note `compacted` is read (the compaction prompt and its summary, the
    note's text; then a fresh conversation from the instruction and that summary, as
    `gyre.agents.react` restarts), then the sub-agent's conversation (the delegated chore as its
    prompt, then its `write_file`); loss on the calls and the summary."""
    from gyre.agents.react import COMPACT_PROMPT, progress_prompt
    from gyre.model.demonstrations import encode_conversation, tool_call
    from gyre.tasks.suites.learnable_long import INSTRUCTION, NOTES, LongChore

    chore = LongChore(
        words=tuple(placeholders[:NOTES]),
        files=tuple(f"{w}.txt" for w in placeholders[NOTES:]),
        delegated=delegated,
    )
    conversations: list[list[dict]] = [[]]
    for i, step in enumerate(s for s in chore.solution().main if s.tool != "read_file"):
        note = chore.note(i)
        conversations[-1].append({"role": "tool", "tool_call_id": f"call_{i}", "content": note})
        if i == compacted:
            conversations[-1] += [
                {"role": "user", "content": COMPACT_PROMPT},
                {"role": "assistant", "content": note},
            ]
            progress = progress_prompt(INSTRUCTION, note)
            conversations.append([{"role": "user", "content": progress}])
        conversations[-1].append(tool_call(step.tool, dict(step.arguments), f"call_{i + 1}"))
    ((sub_task, (write,)),) = chore.solution().sub_agents.items()
    conversations.append(
        [{"role": "user", "content": sub_task}, tool_call("write_file", write.arguments, "sub")]
    )
    ids: list[int] = []
    mask: list[bool] = []
    for messages in conversations:
        encoded = encode_conversation(tokenizer, messages, None)
        ids += encoded.ids
        mask += encoded.loss_mask
    return ids, mask


def copy_pretrain(model: Any, tokenizer: Any, steps: int, *, seed: int, log=None) -> list[float]:
    """Train `model` (a transformers causal LM in float32, train mode) for at most `steps` AdamW
    steps on `CopyDrills` batches, loss on the agent's calls, stopping early once the loss has
    converged (`COPY_DONE_LOSS`); returns the mean loss of every step taken (nats/token).

    Deterministic for equal model, tokenizer, seed and thread count. Gradients clipped to norm
    1.0; the optimizer is dropped afterwards (the warm start makes its own). `log`: optional
    `callable(str)`, about ten lines.

    Raises:
        ValueError: steps < 1, or from `CopyDrills`.
    """
    import torch
    import torch.nn.functional as F

    if steps < 1:
        raise ValueError(f"steps={steps} must be >= 1")
    drills = CopyDrills(tokenizer)
    rng = random.Random(f"{seed}:copy-drills")
    opt = torch.optim.AdamW(model.parameters(), lr=COPY_LR, weight_decay=0.0)
    losses: list[float] = []
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = COPY_LR * min(1.0, (step + 1) / _WARMUP)
        ids_BS, mask_BS = drills.batch(rng)
        logits_BSV = model(input_ids=ids_BS, use_cache=False).logits[:, :-1]
        target_BS = mask_BS[:, 1:]
        loss = F.cross_entropy(logits_BSV[target_BS], ids_BS[:, 1:][target_BS])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        done = (
            len(losses) >= COPY_DONE_WINDOW
            and sum(losses[-COPY_DONE_WINDOW:]) / COPY_DONE_WINDOW < COPY_DONE_LOSS
        )
        if log is not None and ((step + 1) % max(steps // 10, 1) == 0 or step + 1 == steps or done):
            end = " (converged)" if done else ""
            log(f"copy pretraining step {step + 1}/{steps} loss {losses[-1]:.3f}{end}")
        if done:
            break
    return losses
