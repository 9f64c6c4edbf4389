"""Metric sinks: a run's metrics streamed to TensorBoard and Weights & Biases as they are written.

Owns `MetricSink` (what `MetricsWriter` calls for every record), `TensorBoardSink` (the
`tensorboard` package's event files, written by `torch.utils.tensorboard.SummaryWriter`),
`WandbSink` (a `wandb` run, offline unless told otherwise), `open_sinks` (those `[report] sinks`
names), `check_sinks` (the preflight: a configured sink whose package is missing is a
`ConfigError`), and `scalars` / `flatten` (a record and the runtime's `statistics()` records as
`name/field` scalars). Knows nothing about how the numbers were produced or about the report.
"""

from __future__ import annotations

import importlib.util
import math
import os
from collections.abc import ItemsView, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol, cast

import msgspec

from gyre.config import ReportConfig, RunConfig
from gyre.errors import ConfigError

__all__ = [
    "MetricSink",
    "TensorBoardSink",
    "WandbSink",
    "open_sinks",
    "check_sinks",
    "scalars",
    "flatten",
    "wandb_mode",
    "close_all",
    "TENSORBOARD_DIR",
    "WANDB_DIR",
]

TENSORBOARD_DIR = "tensorboard"
"""Folder under the run directory that holds the TensorBoard event files."""
WANDB_DIR = "wandb"
"""Folder under the run directory given to `wandb.init(dir=...)` (wandb adds its own `wandb/`)."""

_PACKAGES: dict[str, tuple[tuple[str, str], ...]] = {
    "tensorboard": (("tensorboard", "tensorboard"), ("torch", "torch")),
    "wandb": (("wandb", "wandb"),),
}
"""Sink -> (module it imports, package that installs it), for `check_sinks`."""


class MetricSink(Protocol):
    """Where `MetricsWriter` streams every record after appending it to `metrics.jsonl`."""

    def write(self, step: int, values: Mapping[str, float]) -> None:
        """Record `values` (tag -> number) at RL step `step` (steps never decrease)."""
        ...

    def close(self) -> None:
        """Flush and release everything; no `write` follows."""
        ...


def flatten(record: Any, prefix: str) -> dict[str, float]:
    """The numeric fields of `record` (a msgspec Struct or a str-keyed dict, nested ones
    included) as `prefix/field[/subfield]` -> float; booleans are 0.0 / 1.0, None is NaN, strings
    and sequences are left out."""
    items: ItemsView[Any, Any]
    if isinstance(record, msgspec.Struct):
        items = msgspec.structs.asdict(record).items()
    elif isinstance(record, Mapping):
        items = record.items()
    else:
        raise TypeError(f"flatten: {type(record).__name__} is neither a msgspec Struct nor a dict")
    out: dict[str, float] = {}
    for key, value in items:
        tag = f"{prefix}/{key}"
        if isinstance(value, bool):
            out[tag] = float(value)
        elif isinstance(value, int | float):
            out[tag] = float(value)
        elif value is None:
            out[tag] = math.nan
        elif isinstance(value, msgspec.Struct | Mapping):
            out.update(flatten(value, tag))
    return out


def scalars(record: Any, statistics: Mapping[str, Any] | None = None) -> tuple[int, dict]:
    """(step, tag -> value) of one metrics record: a step record's fields as `step/<field>`, an
    evaluation's as `eval/<split>/<field>` (its `step` and `split` are not values), and each
    named statistics record as `stats/<name>/<field>`."""
    tag = type(record).__struct_config__.tag
    if tag == "eval":
        prefix = f"eval/{record.split}"
        values = {k: v for k, v in flatten(record, prefix).items() if k != f"{prefix}/step"}
    else:
        values = {k: v for k, v in flatten(record, str(tag)).items() if k != f"{tag}/step"}
    for name, stats in (statistics or {}).items():
        values.update(flatten(stats, f"stats/{name}"))
    return record.step, values


class TensorBoardSink:
    """Scalars into TensorBoard event files under `log_dir`, through `torch.utils.tensorboard`'s
    `SummaryWriter` (the `tensorboard` package's event-file writer). Values are stored as float64
    tensors (`new_style`), so they read back exactly; each `write` is flushed to disk."""

    def __init__(self, log_dir: str | os.PathLike[str]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = Path(log_dir)
        self._writer = SummaryWriter(log_dir=str(self.log_dir))

    def write(self, step: int, values: Mapping[str, float]) -> None:
        for tag, value in values.items():
            self._writer.add_scalar(tag, value, step, new_style=True, double_precision=True)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


def wandb_mode(mode: str, environ: Mapping[str, str]) -> str:
    """The `wandb.init` mode for `[report] wandb_mode`: `auto` is `$WANDB_MODE` when set, else
    `online` when `$WANDB_API_KEY` is set, else `offline` (no network needed)."""
    if mode != "auto":
        return mode
    if environ.get("WANDB_MODE"):
        return environ["WANDB_MODE"]
    return "online" if environ.get("WANDB_API_KEY") else "offline"


class WandbSink:
    """Scalars into a Weights & Biases run written under `<run_dir>/wandb/` (`wandb.init(dir=)`).

    Offline (`wandb_mode`), the run stays on disk (`wandb/offline-run-*/run-*.wandb`) until
    `wandb sync` uploads it; `log` hands values to wandb's own service process and does not wait
    for it; `close` waits until the service wrote everything. The run's name is the run folder's;
    its config is the `RunConfig`."""

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        report: ReportConfig,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        import wandb

        run_dir = Path(run_dir)
        root = run_dir / WANDB_DIR
        root.mkdir(parents=True, exist_ok=True)
        self.mode = wandb_mode(report.wandb_mode, os.environ)
        self._run = wandb.init(
            project=report.wandb_project,
            dir=str(root),
            name=run_dir.name,
            # `$WANDB_MODE` may hold any string: wandb.init checks it
            mode=cast(Literal["online", "offline", "disabled", "shared"], self.mode),
            config=dict(config or {}),
            reinit="create_new",
            settings=wandb.Settings(console="off", silent=True),
        )

    @property
    def run_path(self) -> Path:
        """The wandb run's own folder (`.../wandb/<mode>-run-<time>-<id>`)."""
        return Path(self._run.dir).parent

    def write(self, step: int, values: Mapping[str, float]) -> None:
        self._run.log(dict(values), step=step)

    def close(self) -> None:
        """Finish the run, then stop wandb's service process: `finish` returns before the service
        has written the run's last records to disk, `teardown` waits for it."""
        import wandb

        self._run.finish()
        wandb.teardown()


def check_sinks(report: ReportConfig) -> None:
    """Raise `ConfigError` naming `report.sinks` when a configured sink's package is missing
    (checked without importing it)."""
    for sink in report.sinks:
        for module, package in _PACKAGES[sink]:
            if importlib.util.find_spec(module) is None:
                raise ConfigError(
                    f"report.sinks: {sink!r} needs the {package!r} package, which is not installed "
                    f"(pip install {package}, or remove {sink!r} from report.sinks)"
                )


def open_sinks(config: RunConfig, run_dir: str | os.PathLike[str]) -> list[MetricSink]:
    """The sinks `config.report.sinks` names, writing under `run_dir`. Raises `ConfigError`
    (`check_sinks`) before opening any when a package is missing."""
    check_sinks(config.report)
    run_dir = Path(run_dir)
    opened: list[MetricSink] = []
    try:
        for sink in config.report.sinks:
            if sink == "tensorboard":
                opened.append(TensorBoardSink(run_dir / TENSORBOARD_DIR))
            else:
                opened.append(WandbSink(run_dir, config.report, msgspec.to_builtins(config)))
    except BaseException:
        close_all(opened)
        raise
    return opened


def close_all(sinks: Sequence[MetricSink]) -> None:
    """Close every sink, even when one raises; the first error is raised after the others closed."""
    error: BaseException | None = None
    for sink in sinks:
        try:
            sink.close()
        except Exception as exc:  # every sink still gets closed; the first error propagates
            error = error or exc
    if error is not None:
        raise error
