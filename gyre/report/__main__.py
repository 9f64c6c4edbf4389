"""`python -m gyre.report RUN_DIR`: write `RUN_DIR/report/` (PNG plots and `summary.md`);
with `--serve`, open the live run page on the run folder instead (finished or killed runs)."""

from __future__ import annotations

import argparse
import sys

from gyre.errors import GyreError, RunDirError, interrupted
from gyre.report import write_report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gyre.report", description=__doc__)
    parser.add_argument("run_dir", help="a run directory holding metrics.jsonl")
    parser.add_argument("--serve", action="store_true", help="serve the run page (Ctrl-C stops)")
    parser.add_argument(
        "--config", help="with --serve: the run's config (TOML): Jmax, call log, denominator"
    )
    parser.add_argument("--host", default="127.0.0.1", help="address for --serve (loopback)")
    parser.add_argument("--port", type=int, default=0, help="port for --serve (0: a free one)")
    args = parser.parse_args(argv)
    if args.serve:
        return _serve(args)
    for flag in ("config", "host", "port"):
        if getattr(args, flag) != parser.get_default(flag):
            parser.error(f"--{flag} is only used with --serve")
    try:
        summary = write_report(args.run_dir)
    except FileNotFoundError as exc:
        print(f"error: {args.run_dir}: no metrics ({exc.strerror or exc})", file=sys.stderr)
        return 2
    except NotADirectoryError:
        print(
            f"error: {args.run_dir}: not a run directory "
            "(give the folder that holds metrics.jsonl)",
            file=sys.stderr,
        )
        return 2
    except RunDirError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {summary} and {len(list(summary.parent.glob('*.png')))} plots")
    return 0


def _serve(args: argparse.Namespace) -> int:
    """The live run page on a run folder, behind `$GYRE_CELL_SECRET` (a fresh one if unset)."""
    import os
    import secrets
    from pathlib import Path

    import msgspec

    from gyre.config import load_config
    from gyre.report.live import RunView, serve_run_dir
    from gyre.report.live.server import check_address, tokenizer_decode, view_for

    run_dir = Path(args.run_dir)
    if not (run_dir / "metrics.jsonl").exists() and not (run_dir / "calls.log").exists():
        print(
            f"error: {run_dir}: not a run directory (no metrics.jsonl or calls.log)",
            file=sys.stderr,
        )
        return 2
    chosen = "GYRE_CELL_SECRET" in os.environ
    secret = os.environ.setdefault("GYRE_CELL_SECRET", secrets.token_hex(32))
    try:
        check_address(args.host, args.port, names=("--host", "--port"))
        if args.config:
            config = load_config(args.config)
            config = msgspec.structs.replace(config, run_dir=str(run_dir))
            view = view_for(config, decode=tokenizer_decode(config.model.path))
        else:
            view = RunView(args.run_dir, batch_executions=None)
    except GyreError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not chosen:
        # The login link is single-use; without a secret of the user's own the page would be
        # unreachable after it. This is the user's own terminal, so the token may be shown.
        print(f"bearer token (set GYRE_CELL_SECRET to choose it): {secret}", flush=True)
    try:
        serve_run_dir(view, secret=secret, host=args.host, port=args.port)
    except BaseException as exc:  # Ctrl-C stops the page: trio raises it inside a group
        if not interrupted(exc):
            raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
