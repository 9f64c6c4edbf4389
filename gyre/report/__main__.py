"""`python -m gyre.report RUN_DIR`: write `RUN_DIR/report/` (PNG plots and `summary.md`)."""

from __future__ import annotations

import argparse
import sys

from gyre.errors import RunDirError
from gyre.report import write_report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gyre.report", description=__doc__)
    parser.add_argument("run_dir", help="a run directory holding metrics.jsonl")
    args = parser.parse_args(argv)
    try:
        summary = write_report(args.run_dir)
    except FileNotFoundError as exc:
        print(f"error: {args.run_dir}: no metrics ({exc.strerror or exc})", file=sys.stderr)
        return 2
    except NotADirectoryError:
        print(f"error: {args.run_dir}: not a run directory (give the folder that holds metrics.jsonl)", file=sys.stderr)
        return 2
    except RunDirError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {summary} and {len(list(summary.parent.glob('*.png')))} plots")
    return 0


if __name__ == "__main__":
    sys.exit(main())
