"""Configs of what is trained and how: trajectory selection and packing, the RL objective,
the warm start.

Owns `TrajectoryConfig` (Jmax, micro-batches), `RLConfig` (advantages, PPO-clip, staleness)
and `WarmStartConfig` (supervised fine-tuning before RL). Knows nothing about the engines or
the file format.
"""

from __future__ import annotations

from typing import Literal

from gyre.config.base import Config, check_positive

__all__ = ["TrajectoryConfig", "RLConfig", "WarmStartConfig"]


class TrajectoryConfig(Config, frozen=True):
    """Trajectory trees -> training data (`gyre.trajectory`): Jmax selection and packing."""

    jmax: int = 8
    """Most root-to-leaf trajectories of one execution admitted to training (role priority)."""
    role_limits: dict[str, int] = {}
    """Optional cap per role (`main`, `main_summary`, `sub_agent`, `sub_agent_summary`)."""
    micro_batch_tokens: int = 16384
    """Token budget of one packed micro-batch (a larger tree gets a micro-batch to itself)."""

    def __post_init__(self) -> None:
        check_positive(jmax=self.jmax, micro_batch_tokens=self.micro_batch_tokens)
        roles = ("main", "main_summary", "sub_agent", "sub_agent_summary")
        for role, limit in self.role_limits.items():
            if role not in roles or limit < 0:
                raise ValueError(
                    f"role_limits[{role!r}]={limit} needs a role in {roles} and a limit >= 0"
                )


class RLConfig(Config, frozen=True):
    """The policy loss (`gyre.rl`)."""

    clip_eps: float = 0.2
    """PPO clip range: ratios outside [1 - clip_eps, 1 + clip_eps] stop the gradient."""
    is_cap: float = 2.0
    """Truncated importance-sampling cap on the ratio (dual clip for negative advantages)."""
    max_staleness: int = 2
    """Most weight versions a policy token may lag the trainer; older tokens are masked out."""
    logprob_chunk_size: int = 1024
    """Positions per chunk of the fused selective logprob (extra memory chunk x vocab)."""
    stop_penalty: float = 0.0
    """Subtracted from the reward of an execution stopped at a limit (timeout, turn limit, token
    budget, context: `gyre.tasks.outcome.STOP_REASONS`) before its group's advantages; its score,
    pass rate and metrics are unchanged. 0: a stopped execution's reward is its partial score. A
    penalty keeps an execution that did the work but never finished from out-ranking one that
    finished (the soft overlong punishment of DAPO, Yu et al. 2025, section 3.4, for an agent's
    limits instead of a response length). In [0, 1]."""

    def __post_init__(self) -> None:
        if not 0 < self.clip_eps < 1:
            raise ValueError(f"clip_eps={self.clip_eps} must be in (0, 1)")
        if self.is_cap < 1 + self.clip_eps:
            raise ValueError(f"is_cap={self.is_cap} must be >= 1 + clip_eps")
        if self.max_staleness < 0:
            raise ValueError(f"max_staleness={self.max_staleness} must be >= 0")
        check_positive(logprob_chunk_size=self.logprob_chunk_size)
        if not 0.0 <= self.stop_penalty <= 1.0:  # NaN fails too
            raise ValueError(f"stop_penalty={self.stop_penalty} must be in [0, 1]")


class WarmStartConfig(Config, frozen=True):
    """Supervised warm start (`gyre.model.sft`): the tiny model learns the `learnable` suite's
    demonstrations before RL, so RL starts from a non-zero pass rate."""

    enabled: bool | None = None
    """Fine-tune on the tiny suite's demonstrations before RL. None (the default): only when
    `model.path` is the built-in tiny model (its `gyre_model.json`, or a folder
    `model.init_if_missing` builds; `gyre.model.recipe.is_tiny_model`), so one's own model
    starts RL as it is. True fine-tunes any model (honoured for a foreign one); False never."""
    path: str = ""
    """Output model folder (cached by input hash); empty: `<model.path>-sft`."""
    examples: int = 3072
    """Demonstrations generated with `learnable_examples` (shipped suite instructions excluded).
    With the default 2 epochs (768 steps of 8) the tiny model copies the word and path from the
    instruction (held-out pass rate 65% at T=1); 384 steps only start to (20%), fewer learn the
    call format only (`gyre.model.sft` docstring)."""
    epochs: int = 2
    """Passes over the demonstrations."""
    batch_size: int = 8
    """Demonstrations per optimizer step."""
    learning_rate: float = 5e-3
    """Peak AdamW learning rate (linear warm-up, cosine decay to 10%)."""
    warmup_steps: int = 10
    weight_decay: float = 0.0
    seed: int = 1
    """Seed of the demonstrations and of the batch order; keep it unlike the suite's seed."""
    heldout_suite_seed: int = 0
    """Seed of the shipped `learnable` suite whose instructions are never used as demonstrations."""
    suite: Literal["learnable", "learnable-long"] = "learnable"
    """Which kind of demonstrations: `learnable` (one write per conversation) or `learnable-long`
    (chains of notes: many calls, a compaction summary and a sub-agent per chain, played as
    `gyre.agents.react --compact-chars` with the suite's `COMPACT_CHARS`;
    `gyre.model.demonstrations.chain_conversations`). `examples` counts chains then."""
    slip_fraction: float = 0.0
    """Share of demonstrations in which the teacher slips: the written word ends with a full stop
    (`pearl.`), a prose habit the hidden test (exact word) rejects. The warm-started policy
    inherits the habit and RL must drop it from the reward alone; 0 is a flawless teacher, with
    which the tiny model's remaining errors are half-copied words that RL on 24 training tasks
    does not fix (`examples/cpu.toml`). Drawn per demonstration with a fixed seed. In [0, 1)."""

    copy_pretrain_steps: int = 0
    """Most steps of copy pretraining before the demonstrations (`gyre.model.copy_pretrain`:
    drills of notes and the calls that follow them, words drawn from every word the tokenizer
    keeps whole; it stops early once its loss has converged), for a model that cannot yet copy
    from its context, like the freshly built tiny model; drawn with `seed`. 0: none. The tiny
    model starts copying after 330-500 of them; `learning_rate` 1e-3 on the chains after keeps
    it, 5e-3 does not."""

    def __post_init__(self) -> None:
        check_positive(
            examples=self.examples,
            epochs=self.epochs,
            batch_size=self.batch_size,
            learning_rate=self.learning_rate,
        )
        if self.suite not in ("learnable", "learnable-long"):
            raise ValueError(f"suite={self.suite!r} must be 'learnable' or 'learnable-long'")
        if not 0 <= self.slip_fraction < 1:
            raise ValueError(f"slip_fraction={self.slip_fraction} must be in [0, 1)")
        if self.copy_pretrain_steps < 0:
            raise ValueError(f"copy_pretrain_steps={self.copy_pretrain_steps} must be >= 0")
        if self.warmup_steps < 0 or self.weight_decay < 0:
            raise ValueError(
                f"warmup_steps={self.warmup_steps} and weight_decay={self.weight_decay} "
                "must be >= 0"
            )
