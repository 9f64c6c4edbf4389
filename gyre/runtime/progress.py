"""Live progress of a run: a rich table on a terminal, one plain line per event otherwise.

Owns `Progress`, which the runtime (`gyre.runtime.elastic`) feeds with the records it writes to
`metrics.jsonl` (`StepMetrics`, `EvalMetrics`) and the job with free-text messages. On a terminal
it keeps a live table of the latest steps under a header with the held-out pass rate; when the
output is not a terminal (CI, `make run | tee log`) it prints one self-contained line per step,
evaluation or message, flushed at once. Knows nothing about how the numbers were produced; never
raises on a NaN.
"""

from __future__ import annotations

import math
import sys
from typing import TYPE_CHECKING, TextIO

from gyre.runtime.metrics import EvalMetrics, StepMetrics

if TYPE_CHECKING:
    from rich.live import Live

__all__ = ["Progress", "format_step", "format_eval"]


def _num(x: float, fmt: str) -> str:
    return "nan" if math.isnan(x) else format(x, fmt)


def format_step(r: StepMetrics, total_steps: int | None = None) -> str:
    """The plain one-line form of a step record (what non-terminal output shows)."""
    of = f"/{total_steps}" if total_steps else ""
    skipped = "" if r.applied else "  SKIPPED"
    return (
        f"step {r.step}{of}  v{r.version}  pass {_num(r.pass_rate, '.3f')}  "
        f"reward {_num(r.mean_reward, '.3f')}  "
        f"exec {r.executions} (partial {r.partial}, failed {r.failed})  tokens {r.policy_tokens}  "
        f"dedup {_num(r.dedup_ratio, '.2f')}  |dlogp| {_num(r.logprob_abs_diff_mean, '.1e')}  "
        f"|g| {_num(r.grad_norm, '.2g')}  "
        f"time {r.step_s:.1f}s (rollout {r.rollout_s:.1f}, train {r.train_s:.1f}, "
        f"sync {r.sync_s:.1f}){skipped}"
    )


def format_eval(r: EvalMetrics) -> str:
    """The plain one-line form of an evaluation record."""
    return (
        f"eval {r.split} at step {r.step}  v{r.version}  pass {_num(r.pass_rate, '.3f')}  "
        f"reward {_num(r.mean_reward, '.3f')}  ({r.executions} executions, {r.eval_s:.1f}s)"
    )


class Progress:
    """Shows a run's progress; use as a context manager (the live table stops on exit).

    Args:
        total_steps: steps the run will take, shown as `step k/N` (None: unknown).
        stream: where to write (default `sys.stdout`).
        live: force the rich live table (True) or plain lines (False); None decides by whether
            `stream` is a terminal (rich's detection: honours `FORCE_COLOR`, `TERM=dumb`).
        rows: most recent steps kept in the live table.
    Raises:
        ValueError: total_steps < 0 or rows < 1.
    """

    def __init__(
        self,
        *,
        total_steps: int | None = None,
        stream: TextIO | None = None,
        live: bool | None = None,
        rows: int = 15,
    ) -> None:
        if (total_steps is not None and total_steps < 0) or rows < 1:
            raise ValueError(f"{total_steps=} must be >= 0 and {rows=} >= 1")
        from rich.console import Console

        self.total_steps = total_steps
        self.stream = stream if stream is not None else sys.stdout
        self.console = Console(file=self.stream, highlight=False)
        self.live_mode = (
            (self.console.is_terminal and not self.console.is_dumb_terminal)
            if live is None
            else live
        )
        self.rows = rows
        self._steps: list[StepMetrics] = []
        self._evals: list[EvalMetrics] = []
        self._live: Live | None = None

    # -- events -----------------------------------------------------------------------------

    def step(self, record: StepMetrics) -> None:
        """Show one finished step."""
        self._steps.append(record)
        del self._steps[: -self.rows]
        if self.live_mode:
            self._refresh()
        else:
            self._line(format_step(record, self.total_steps))

    def eval(self, record: EvalMetrics) -> None:
        """Show one evaluation (held-out or train split)."""
        self._evals.append(record)
        if self.live_mode:
            self.console.print(format_eval(record))
            self._refresh()
        else:
            self._line(format_eval(record))

    def message(self, text: str) -> None:
        """Show a free-text line (warm start, checkpoint, resume...) above the table."""
        if self.live_mode:
            self.console.print(text, markup=False)
        else:
            self._line(text)

    # -- lifetime ---------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the live table, leaving its last state on screen. Idempotent."""
        if self._live is not None:
            self._live.stop()
            self._live = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals --------------------------------------------------------------------------

    def _line(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()

    def _refresh(self) -> None:
        from rich.live import Live

        if self._live is None:
            self._live = Live(
                self._table(), console=self.console, refresh_per_second=4, transient=False
            )
            self._live.start()
        else:
            self._live.update(self._table(), refresh=True)

    def _table(self):
        from rich.table import Table

        heldout = [e for e in self._evals if e.split == "heldout"]
        title = "gyre RL"
        if heldout:
            first, last = heldout[0], heldout[-1]
            title += (
                f"  |  held-out pass {100 * first.pass_rate:.1f}% (step {first.step})"
                f" -> {100 * last.pass_rate:.1f}% (step {last.step})"
            )
        table = Table(title=title, title_justify="left")
        for name in (
            "step",
            "pass",
            "reward",
            "exec",
            "partial",
            "failed",
            "tokens",
            "dedup",
            "|dlogp|",
            "|g|",
            "rollout s",
            "train s",
            "sync s",
            "step s",
        ):
            table.add_column(name, justify="right")
        of = f"/{self.total_steps}" if self.total_steps else ""
        for r in self._steps:
            table.add_row(
                f"{r.step}{of}" + ("" if r.applied else " skip"),
                _num(r.pass_rate, ".3f"),
                _num(r.mean_reward, ".3f"),
                str(r.executions),
                str(r.partial),
                str(r.failed),
                str(r.policy_tokens),
                _num(r.dedup_ratio, ".2f"),
                _num(r.logprob_abs_diff_mean, ".1e"),
                _num(r.grad_norm, ".2g"),
                f"{r.rollout_s:.1f}",
                f"{r.train_s:.1f}",
                f"{r.sync_s:.1f}",
                f"{r.step_s:.1f}",
            )
        return table
