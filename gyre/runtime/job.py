"""The node's job: `run(config)` (re-exported as `gyre.run`).

Owns start-up of one node's work: make sure the model folder exists, start the cells, and run the
job on one anyio event loop (trio). At this stage the job serves the model in a vLLM cell and
prints a sampled reply with its exact token IDs, behaviour logprobs and weight versions; the RL
loop replaces it. Knows nothing about how an engine samples or how a cell hosts it.
"""

from __future__ import annotations

import logging
from pathlib import Path

import anyio

from gyre.config import RunConfig

__all__ = ["run", "ensure_model"]

logger = logging.getLogger(__name__)


def ensure_model(config: RunConfig) -> Path:
    """The model folder of `config`, built from the tiny-model recipe if missing and allowed.

    Raises `FileNotFoundError` when the folder is missing and
    `init_if_missing` is false.
    """
    path = Path(config.model.path)
    if (path / "config.json").exists():
        return path
    if not config.model.init_if_missing:
        raise FileNotFoundError(f"model.path={str(path)!r} has no config.json and model.init_if_missing is false")
    from gyre.model import init_model_dir

    logger.info("building the reference tiny model at %s (seed %d)", path, config.model.seed)
    return init_model_dir(path, config.model)


async def _sample_job(config: RunConfig, model_dir: Path) -> None:
    from transformers import AutoTokenizer

    from gyre.engines import GenerateRequest, SamplingParams, collect
    from gyre.runtime.cell_client import open_cell

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    messages = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Write the word blue to out.txt, then finish."},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    prompt_ids = tokenizer.encode(text, add_special_tokens=False)
    log_path = Path(config.run_dir) / "cells" / "cell-0.log"
    print(f"starting a {config.engine.backend} cell on {model_dir} (log: {log_path}) ...", flush=True)
    async with open_cell(model_dir, config.engine, log_path=log_path, host=config.cells.host) as engine:
        sampling = SamplingParams(
            max_tokens=24, temperature=1.0, seed=config.seed, stop_token_ids=(tokenizer.eos_token_id,)
        )
        [choice] = await collect(engine, GenerateRequest(request_id="sample-0", prompt_ids=prompt_ids, sampling=sampling))
        stats = await engine.refresh_statistics()
    print(f"prompt: {len(prompt_ids)} tokens; completion: {len(choice.token_ids)} tokens, finish={choice.finish_reason}")
    print(f"{'#':>3}  {'token_id':>8}  {'logprob':>9}  {'version':>7}  text")
    for i, (tok, lp, ver) in enumerate(zip(choice.token_ids, choice.logprobs, choice.versions)):
        print(f"{i:>3}  {tok:>8}  {lp:>9.4f}  {ver:>7}  {tokenizer.decode([tok])!r}")
    print(f"engine: {stats.tokens_generated} tokens generated, weight version {stats.weight_version}")


def run(config: RunConfig) -> None:
    """Run one node's job described by `config` on a trio event loop (blocks until done).

    Raises `GyreError` subclasses for engine and config failures, `FileNotFoundError` for a
    missing model folder.
    """
    model_dir = ensure_model(config)
    anyio.run(_sample_job, config, model_dir, backend="trio")
