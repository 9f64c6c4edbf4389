"""`python -m gyre.node --config FILE` (a run, or the head of several hosts) and
`python -m gyre.node --join HEAD:PORT` (a worker host): one node's entry point.

Owns the command line only: load and validate the config (one clear line on error, before
anything starts), then hand it to `gyre.job.run`; or join a head (`gyre.cell.join.run_worker`).
The launchers' rendezvous variables are read here and removed from the environment (so no cell's
DeepSpeed mistakes them for its own group): `RANK` 0 is the head, with `WORLD_SIZE - 1` workers
and its join endpoint at `MASTER_ADDR:MASTER_PORT`; any other `RANK` joins `MASTER_ADDR:
MASTER_PORT` (Slurm, Kubernetes, torchrun-style launchers). The CLI does not grow a flag per
option: runs are TOML files under `examples/`.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from gyre.config import load_config
from gyre.errors import GyreError, grouped_errors, interrupted

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """CLI: `python -m gyre.node --config FILE`. Returns the process exit code."""
    parser = argparse.ArgumentParser(prog="python -m gyre.node", description="Run one gyre node.")
    parser.add_argument("--config", help="run config (TOML), see examples/")
    parser.add_argument(
        "--join",
        metavar="HEAD:PORT",
        help="join the head node at HEAD:PORT as a worker host (secret in $GYRE_JOIN_SECRET)",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in run_dir from its last checkpoint "
        "(or start one if run_dir holds no run)",
    )
    args = parser.parse_args(argv)
    rendezvous = _launcher_rendezvous()
    if args.join is None and rendezvous is not None and rendezvous[0] > 0:
        args.join = rendezvous[2]
        if args.config is not None:  # the same command line on every host of a launcher
            print(
                f"gyre: RANK={rendezvous[0]}: a worker of the head at {args.join}; the run's "
                f"config comes from the head ({args.config} is not read here)",
                file=sys.stderr,
            )
            args.config = None
    if (args.config is None) == (args.join is None):
        parser.error("give --config FILE (a run or the head) or --join HEAD:PORT (a worker)")
    if args.join is not None and args.resume:
        parser.error("--resume is for a run's --config; a worker (--join) has nothing to resume")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    # httpx logs every request at INFO: thousands of lines a run, burying the per-step table; and
    # transformers draws a "Writing model shards" bar per weight snapshot (cells inherit this).
    logging.getLogger("httpx").setLevel(logging.WARNING)
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        if args.join is not None:
            return _join(args.join)
        config = load_config(args.config)
        if rendezvous is not None:
            config = _as_head(config, rendezvous)
        from gyre.job import run

        run(config, resume=args.resume)
    except (GyreError, FileNotFoundError) as exc:
        print(f"gyre: error: {exc}", file=sys.stderr)
        return 2
    except BaseException as exc:
        errors = grouped_errors(exc)
        if errors:  # e.g. a cell that died, raised out of the driver's task groups
            print(f"gyre: error: {'; '.join(str(e) for e in errors)}", file=sys.stderr)
            return 2
        if not interrupted(exc):
            raise
        print(
            f"gyre: interrupted; `python -m gyre.node --config {args.config} --resume` "
            "continues from the "
            "last checkpoint",
            file=sys.stderr,
        )
        return 130  # 128 + SIGINT, as a shell reports it
    return 0


_RENDEZVOUS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _launcher_rendezvous() -> tuple[int, int, str] | None:
    """(RANK, WORLD_SIZE, "MASTER_ADDR:MASTER_PORT") when a launcher set them (all four), else
    None; removed from the environment either way. Raises `SystemExit` on a malformed value."""
    values = {name: os.environ.pop(name, None) for name in _RENDEZVOUS}
    os.environ.pop("LOCAL_RANK", None)
    if all(v is None for v in values.values()):
        return None
    given = {name: v for name, v in values.items() if v}
    missing = [name for name in _RENDEZVOUS if name not in given]
    if missing:
        raise SystemExit(
            f"gyre: error: launcher variables {missing} are not set (all four: "
            f"{', '.join(_RENDEZVOUS)})"
        )
    try:
        rank, world = int(given["RANK"]), int(given["WORLD_SIZE"])
        port = int(given["MASTER_PORT"])
    except ValueError:
        raise SystemExit(
            f"gyre: error: RANK, WORLD_SIZE and MASTER_PORT must be integers: {values}"
        ) from None
    if not 0 <= rank < world:
        raise SystemExit(f"gyre: error: RANK={rank} must be in [0, WORLD_SIZE={world})")
    return rank, world, f"{given['MASTER_ADDR']}:{port}"


def _as_head(config, rendezvous: tuple[int, int, str]):
    """`config` as the head of a launcher's `WORLD_SIZE` hosts: `WORLD_SIZE - 1` workers, the
    join endpoint at `MASTER_ADDR:MASTER_PORT`."""
    import msgspec

    _rank, world, address = rendezvous
    host, _, port = address.rpartition(":")
    cluster = msgspec.structs.replace(config.cluster, workers=world - 1, host=host, port=int(port))
    return msgspec.structs.replace(config, cluster=cluster)


def _join(head: str) -> int:
    """Run this host as a worker of the head at `head` until the run ends."""
    import anyio

    from gyre.cell.join import run_worker

    return anyio.run(run_worker, head, backend="trio")


if __name__ == "__main__":
    sys.exit(main())
