"""`python -m gyre.gateway --config FILE`: the run with its executions taken by your own agent loop.

Owns the command line only. It runs the same job as `python -m gyre.node` on the same config
file (engines or cells, the TITO proxy, the RL driver, checkpoints, the report) with
`[gateway] enabled` forced on: the harness starts no agent; each execution the driver asks for is
published on the execution API (`gyre.rollout.gateway`, address in `<run_dir>/gateway.json`),
where an agent loop run anywhere claims it, runs its agent against the proxy with the key it got,
posts a reward or asks for the task's verifier, and closes it. Training consumes these executions
exactly like the harness's. Knows nothing about HTTP routes or how the run trains.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

import msgspec

from gyre.config import load_config
from gyre.errors import GyreError, grouped_errors, interrupted

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """CLI: `python -m gyre.gateway --config FILE [--resume]`. Returns the process exit code:
    0 done, 2 a config or run error (one line on stderr), 130 interrupted."""
    parser = argparse.ArgumentParser(
        prog="python -m gyre.gateway",
        description="Run gyre with executions claimed over HTTP by your own agent loop.",
    )
    parser.add_argument("--config", required=True, help="run config (TOML), see examples/")
    parser.add_argument(
        "--resume", action="store_true", help="continue the run in run_dir from its last checkpoint"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        config = load_config(args.config)
        config = msgspec.structs.replace(
            config, gateway=msgspec.structs.replace(config.gateway, enabled=True)
        )
        from gyre.job import run

        run(config, resume=args.resume)  # its preflight checks the gateway (`check_gateway`)
    except (GyreError, FileNotFoundError) as exc:
        print(f"gyre: error: {exc}", file=sys.stderr)
        return 2
    except BaseException as exc:
        errors = grouped_errors(exc)
        if errors:
            print(f"gyre: error: {'; '.join(str(e) for e in errors)}", file=sys.stderr)
            return 2
        if not interrupted(exc):
            raise
        print("gyre: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
