"""`python -m gyre.node --config FILE`: one node's entry point.

Owns the command line only: load and validate the config (one clear line on error, before
anything starts), then hand it to `gyre.job.run`. The CLI does not grow a flag per option:
runs are TOML files under `examples/`.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from gyre.config import load_config
from gyre.errors import GyreError

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """CLI: `python -m gyre.node --config FILE`. Returns the process exit code."""
    parser = argparse.ArgumentParser(prog="python -m gyre.node", description="Run one gyre node.")
    parser.add_argument("--config", required=True, help="run config (TOML), see examples/")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in run_dir from its last checkpoint "
        "(or start one if run_dir holds no run)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    # httpx logs every request at INFO: thousands of lines a run, burying the per-step table; and
    # transformers draws a "Writing model shards" bar per weight snapshot (cells inherit this).
    logging.getLogger("httpx").setLevel(logging.WARNING)
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        config = load_config(args.config)
        from gyre.job import run

        run(config, resume=args.resume)
    except (GyreError, FileNotFoundError) as exc:
        print(f"gyre: error: {exc}", file=sys.stderr)
        return 2
    except BaseException as exc:
        errors = _gyre_errors(exc)
        if errors:  # e.g. a cell that died, raised out of the driver's task groups
            print(f"gyre: error: {'; '.join(str(e) for e in errors)}", file=sys.stderr)
            return 2
        if not _interrupted(exc):
            raise
        print(
            f"gyre: interrupted; `python -m gyre.node --config {args.config} --resume` "
            "continues from the "
            "last checkpoint",
            file=sys.stderr,
        )
        return 130  # 128 + SIGINT, as a shell reports it
    return 0


def _gyre_errors(exc: BaseException) -> list[GyreError]:
    """The `GyreError`s of an exception group that holds nothing else (trio and anyio raise
    errors out of task groups wrapped in groups); [] when it holds anything else."""
    if not isinstance(exc, BaseExceptionGroup):
        return []
    match, rest = exc.split(GyreError)
    if match is None or rest is not None:
        return []
    out, todo = [], [match]
    while todo:
        e = todo.pop()
        if isinstance(e, BaseExceptionGroup):
            todo.extend(reversed(e.exceptions))
        else:
            out.append(e)
    return out


def _interrupted(exc: BaseException) -> bool:
    """Whether `exc` is Ctrl-C: a KeyboardInterrupt, or a group of nothing else (trio and anyio
    raise it out of task groups wrapped in a `BaseExceptionGroup`)."""
    if isinstance(exc, BaseExceptionGroup):
        _, rest = exc.split(KeyboardInterrupt)
        return rest is None
    return isinstance(exc, KeyboardInterrupt)


if __name__ == "__main__":
    sys.exit(main())
