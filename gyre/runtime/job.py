"""The node's job: `run(config)` (re-exported as `gyre.run`).

Owns start-up of one node's work: make sure the model folder exists, start the cells, and run the
job on one anyio event loop (trio). The job is the supervised warm start (`gyre.model.sft`,
cached) and then the RL loop: with one cell the colocate loop (`gyre.runtime.loop.run_rl`: the
trainer in the node, checkpoints and `--resume`), with `cells.num_cells > 1` the elastic runtime
(`gyre.runtime.elastic.run_elastic`: every cell a vLLM engine and a DeepSpeed trainer, roles by
`config.scheduler`). Knows nothing about how an engine samples or how a cell hosts it.
"""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path

import anyio

from gyre.config import RunConfig
from gyre.errors import ConfigError
from gyre.runtime.checkpoint import LoopState
from gyre.runtime.loop import run_rl, split_tasks
from gyre.tasks.scorer import check_verifier_python

__all__ = ["run", "ensure_model"]

logger = logging.getLogger(__name__)


def ensure_model(config: RunConfig) -> Path:
    """The model folder of `config`, built from the tiny-model recipe if missing and allowed.

    Raises `FileNotFoundError` when the folder is missing and `init_if_missing` is false.
    """
    path = Path(config.model.path)
    if (path / "config.json").exists():
        return path
    if not config.model.init_if_missing:
        raise FileNotFoundError(f"model.path={str(path)!r} has no config.json and model.init_if_missing is false")
    from gyre.model import init_model_dir

    logger.info("building the reference tiny model at %s (seed %d)", path, config.model.seed)
    return init_model_dir(path, config.model)


def run(config: RunConfig, *, resume: bool = False) -> LoopState:
    """Run one node's job described by `config` on a trio event loop (blocks until done):
    the RL loop to `config.loop.steps` steps. `resume=True` continues from the run's newest
    checkpoint. Returns the final loop state.

    Raises `GyreError` subclasses for engine and config failures, `FileNotFoundError` for a
    missing model folder.
    """
    train, heldout = split_tasks(config)  # a bad task folder is reported before anything is built or started
    check_verifier_python([*train, *heldout])  # so is a verifier that could not run
    model_dir = ensure_model(config)
    if config.warm_start.enabled:
        from gyre.model.sft import warm_start

        out = config.warm_start.path or f"{config.model.path.rstrip('/')}-sft"
        print(f"warm start: fine-tuning {model_dir} on demonstrations -> {out} (cached)", flush=True)
        model_dir = warm_start(model_dir, out, config.warm_start, log=lambda line: print(f"  {line}", flush=True))
    from gyre.report import write_report
    from gyre.runtime.progress import Progress

    if config.cells.num_cells > 1:
        if resume:
            raise ConfigError("--resume: multi-cell runs (cells.num_cells > 1) cannot resume yet")
        from gyre.runtime.elastic import run_elastic

        runtime = anyio.run(partial(run_elastic, config, model_dir), backend="trio")
        summary = write_report(config.run_dir)
        print(f"done: {runtime.steps_done} steps, weight version {runtime.version}; report: {summary}", flush=True)
        return LoopState(step=runtime.steps_done, version=runtime.version, task_cursor=-(-runtime.dispatched // runtime.G))
    with Progress(total_steps=config.loop.steps) as progress:
        state = anyio.run(partial(run_rl, config, model_dir, resume=resume, progress=progress), backend="trio")
        summary = write_report(config.run_dir)
        progress.message(f"done: {state.step} steps, weight version {state.version}; report: {summary}")
    return state
