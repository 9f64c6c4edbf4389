"""The node's job: `run(config)` (re-exported as `gyre.run`).

Owns start-up of one node's work: the preflight (`preflight`: every path, the run folder and the
agent program checked before anything is built or started), the model folder (`ensure_model`:
the tiny model is built only when asked), the supervised warm start (`gyre.model.sft`, cached;
by default only for the tiny model, `warm_start_enabled`), the check that some task fits the
context (`check_context_fit`), then the RL runtime on one anyio event loop (trio) for every cell
count (`gyre.runtime.elastic_job.run_elastic`: roles by `config.scheduler`, `auto` = colocate on
one cell, elastic on more), and the report at the end.
Top level, above the runtime, the model and the report it ties together. Knows nothing about how
an engine samples or how a cell hosts it.
"""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path

import anyio

from gyre.agents.harness import check_agent_command
from gyre.agents.isolation import check_isolation
from gyre.config import RunConfig, check_types
from gyre.errors import ConfigError
from gyre.rollout.harness import with_interpreter
from gyre.rollout.tasks import split_tasks
from gyre.runtime.checkpoint import LoopState, check_run_dir
from gyre.runtime.data_stream import evaluated
from gyre.runtime.sinks import check_sinks
from gyre.runtime.trainer_checkpoint import check_trainer_checkpoint
from gyre.tasks.scorer import check_verifier_python
from gyre.tito.model_format import check_parser_names

__all__ = [
    "run",
    "preflight",
    "ensure_model",
    "check_model",
    "check_context_fit",
    "warm_start_enabled",
]

logger = logging.getLogger(__name__)


def check_model(config: RunConfig) -> bool:
    """Whether `model.path` is a model folder already (True) or one `ensure_model` will build
    the tiny model into (False: missing or empty, and `model.init_if_missing`).

    Raises `ConfigError` (one line naming `model.path`) when it is a file, a non-empty folder
    with no `config.json` (the recipe never writes over someone else's files), or missing or
    empty without `model.init_if_missing` (the tiny model is built only when asked, so a
    mistyped path to one's own model is never replaced by it)."""
    path = Path(config.model.path)
    if (path / "config.json").exists():
        return True
    if path.exists() and not path.is_dir():
        raise ConfigError(f"model.path={str(path)!r} is a file, not a Hugging Face model folder")
    if path.exists() and any(path.iterdir()):
        raise ConfigError(
            f"model.path={str(path)!r} is a folder with files but no config.json: "
            "not a Hugging Face model folder, and the tiny model is only built into an empty one"
        )
    if not config.model.init_if_missing:
        state = "is an empty folder" if path.exists() else "does not exist"
        raise ConfigError(
            f"model.path={str(path)!r} {state}: point it at a Hugging Face model folder, or set "
            "[model] init_if_missing = true to build the built-in tiny model there"
        )
    return False


def warm_start_enabled(config: RunConfig) -> bool:
    """Whether the run fine-tunes on the tiny suite's demonstrations before RL:
    `warm_start.enabled` when set, else only for the built-in tiny model (`model.path` holds it,
    `gyre.model.recipe.is_tiny_model`, or `model.init_if_missing` will build it there)."""
    if config.warm_start.enabled is not None:
        return config.warm_start.enabled
    from gyre.model.recipe import is_tiny_model

    path = Path(config.model.path)
    if (path / "config.json").exists():
        return is_tiny_model(path)
    return config.model.init_if_missing


def ensure_model(config: RunConfig) -> Path:
    """The model folder of `config`, built from the tiny-model recipe if missing and
    `model.init_if_missing`. Raises `ConfigError` as `check_model` does."""
    path = Path(config.model.path)
    if check_model(config):
        return path
    from gyre.model import init_model_dir

    logger.info("building the reference tiny model at %s (seed %d)", path, config.model.seed)
    return init_model_dir(path, config.model)


def check_context_fit(config: RunConfig, model_dir: Path) -> None:
    """Raise `ConfigError` naming `engine.max_model_len` and `tasks.suites` when no training task
    fits the context: every instruction alone, tokenized by `model_dir`'s tokenizer, already takes
    `max_model_len` tokens or more (the prompt around it only adds to that)."""
    from transformers import AutoTokenizer

    train, _ = split_tasks(config)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    shortest = min(len(tokenizer(t.instruction)["input_ids"]) for t in train)
    limit = config.engine.max_model_len
    if shortest >= limit:
        raise ConfigError(
            f"engine.max_model_len={limit}: no training task of tasks.suites="
            f"{list(config.tasks.suites)} fits (the shortest instruction alone is {shortest} "
            "tokens); raise engine.max_model_len or choose a suite with shorter tasks"
        )


def preflight(config: RunConfig, *, resume: bool) -> tuple[LoopState, Path] | None:
    """Every check that can fail without building or starting anything, in the order a user
    would fix them: the types of a config built in Python (`check_types`), the scheduler policy
    for the run's cells (`SchedulerConfig.policy_for`), task folders, verifier interpreter,
    agent program, isolation when required (with `[gateway] enabled` instead: the execution
    API's address, `check_gateway`), run folder (and, on a resume, the settings the run was
    trained with: `check_resume_config`; and the topology and model its checkpoint was written
    at: `check_trainer_checkpoint`), warm-start folder, the packages of the metric sinks
    (`[report] sinks`), the names of `[proxy] tool_parser` and `reasoning_parser`, the join
    secret of a head with workers (`[cluster]`), the live page's address (`[observe]`). The
    model folder is checked by `ensure_model`, first thing after (a finished run resumed needs
    none). Returns the checkpoint a resumed run continues from (None: step 0). Raises
    `ConfigError` or `TaskError` naming the key or path, `TypeError` for a `resume` that is no
    bool."""
    if not isinstance(resume, bool):
        raise TypeError(f"resume={resume!r} must be True or False")
    check_types(config)  # a config built in Python, type-checked as a TOML file is
    config.scheduler.policy_for(config.cells.num_cells * (config.cluster.workers + 1))
    train, heldout = split_tasks(config)
    check_verifier_python([*train, *heldout])
    harness = config.tasks.harness
    if config.gateway.enabled:  # agent loops run elsewhere: no agent program, no isolation
        from gyre.rollout.gateway import check_gateway

        check_gateway(config)
    else:
        check_agent_command(with_interpreter(harness).agent_command, path=harness.env.get("PATH"))
        check_isolation(with_interpreter(harness), run_dir=Path(config.run_dir).resolve())
    found = check_run_dir(
        Path(config.run_dir).resolve(),
        resume=resume,
        records=(config.proxy.log_name,),
    )
    if found is not None:  # what the checkpoint was written at, before what the run recorded
        model = Path(config.model.path)
        has_model = (model / "config.json").exists()  # else `run` checks it once built
        check_trainer_checkpoint(config, found[1], model_dir=model if has_model else None)
    if resume:  # imported here: the journal's module brings torch
        from gyre.runtime.elastic_resume import check_resume_config

        trained = found is not None
        check_resume_config(Path(config.run_dir).resolve(), config, train, heldout, trained=trained)
    if warm_start_enabled(config):
        from gyre.model.sft import check_output_dir, output_dir

        key = (
            "warm_start.path"
            if config.warm_start.path
            else "warm_start.path (default: model.path + '-sft')"
        )
        try:
            check_output_dir(output_dir(config.model.path, config.warm_start))
        except FileExistsError as exc:
            raise ConfigError(f"{key}: {exc}") from None
    check_sinks(config.report)
    check_parser_names(config.proxy.tool_parser, config.proxy.reasoning_parser)
    if config.cluster.workers and not config.cluster.join_secret():
        raise ConfigError(
            f"cluster.workers={config.cluster.workers} needs a join secret: set [cluster] secret "
            "or $GYRE_JOIN_SECRET (workers join with the same value)"
        )
    if config.observe.page:
        from gyre.report.live.server import check_address

        check_address(config.observe.host, config.observe.port)
    return found


def run(config: RunConfig, *, resume: bool = False) -> LoopState:
    """Run one node's job described by `config` on a trio event loop (blocks until done):
    the RL loop to `config.loop.steps` steps. `resume=True` continues from the run's newest
    checkpoint (a `run_dir` without a run starts one); a run that already finished returns its
    state without starting anything.
    Returns the final loop state.

    Raises `GyreError` subclasses for engine and config failures (config ones, `preflight`'s,
    before anything is built or started; a missing model folder is one of them; a `config` that
    is no `RunConfig` is a `ConfigError`), and `TypeError` for a `resume` that is no bool.
    """
    found = preflight(config, resume=resume)
    if found is not None and _finished(config, found[0]):
        print(
            f"nothing to do: {config.run_dir} already ran its {found[0].step} steps "
            "and final evaluation "
            f"(loop.steps={config.loop.steps}; raise it to train further)",
            flush=True,
        )
        return found[0]
    if found is not None:
        print(
            f"resuming {config.run_dir} after step {found[0].step} of {config.loop.steps} "
            f"(weight version {found[0].version})",
            flush=True,
        )
        if check_trainer_checkpoint(config, found[1]) == "universal":
            print(
                "  its trainer checkpoint was written at another cells.devices_per_cell: "
                "converting it to DeepSpeed's universal checkpoint for "
                f"cells.devices_per_cell = {config.cells.devices_per_cell}",
                flush=True,
            )
    warm = warm_start_enabled(config)  # before ensure_model builds anything
    built = not (Path(config.model.path) / "config.json").exists()
    model_dir = ensure_model(config)
    if found is not None and built:  # the preflight had no model to hold to the checkpoint's
        check_trainer_checkpoint(config, found[1], model_dir=model_dir)
    check_context_fit(config, model_dir)
    if warm:
        from gyre.model.sft import output_dir, warm_start

        out = output_dir(config.model.path, config.warm_start)
        print(
            f"warm start: fine-tuning {model_dir} on demonstrations -> {out} "
            "(reused if already there)",
            flush=True,
        )
        model_dir = warm_start(
            model_dir, out, config.warm_start, log=lambda line: print(f"  {line}", flush=True)
        )
    from gyre.report import write_report
    from gyre.runtime.elastic_job import run_elastic
    from gyre.runtime.progress import Progress

    with Progress(total_steps=config.loop.steps) as progress:
        job = partial(run_elastic, progress=progress, resume=resume)
        runtime = anyio.run(partial(_observed, config, model_dir, job), backend="trio")
        summary = write_report(config.run_dir, log_name=config.proxy.log_name)
        done = runtime.state
        progress.message(
            f"done: {done.steps_done} steps, weight version {done.weights.version}; "
            f"report: {summary}"
        )
    return LoopState(
        step=runtime.state.steps_done,
        version=runtime.state.weights.version,
        task_cursor=-(-runtime.state.dispatched // runtime.G),
    )


async def _observed(config: RunConfig, model_dir: Path, job):
    """`await job(config, model_dir)`, with the live run page served beside it when
    `[observe] page` is on (the runtime's feed attached); off, no port is opened."""
    if not config.observe.page:
        return await job(config, model_dir)
    from gyre.cell.wire import cell_secret
    from gyre.report.live import RuntimeFeed, open_page
    from gyre.report.live.server import tokenizer_decode, view_for

    decode = await anyio.to_thread.run_sync(tokenizer_decode, model_dir)
    feed = RuntimeFeed()
    obs = config.observe
    async with open_page(
        view_for(config, decode=decode),
        secret=cell_secret(),
        host=obs.host,
        port=obs.port,
        snapshot=feed.snapshot,
        poll_interval_s=obs.poll_interval_s,
    ):
        return await job(config, model_dir, on_runtime=feed.attach)


def _finished(config: RunConfig, state: LoopState) -> bool:
    """Whether a resumed run has nothing left: every step trained and, when it has held-out tasks,
    the last one evaluated (the loop evaluates at its end)."""
    if state.step < config.loop.steps:
        return False
    return not config.loop.heldout_tasks or evaluated(Path(config.run_dir).resolve(), state.step)
