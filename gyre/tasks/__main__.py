"""`python -m gyre.tasks`: generate the shipped suites, validate suites.

    python -m gyre.tasks generate --out examples/tasks --seed 0 [--suite NAME]
    python -m gyre.tasks check examples/tasks/nl2repo-mini [...]

Owns only argument parsing; the work is in `suites` and `task`. Demonstrations (the reference
agent's conversations on tasks) are written by `python -m gyre.model demos`.
"""

from __future__ import annotations

import argparse
import sys

from gyre.errors import TaskError
from gyre.tasks.suites import SUITES, generate_suite
from gyre.tasks.task import load_suite


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gyre.tasks")
    sub = parser.add_subparsers(dest="cmd", required=True)
    gen = sub.add_parser("generate", help="write the shipped suites from a seed")
    gen.add_argument("--out", default="examples/tasks")
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument(
        "--suite", action="append", choices=sorted(SUITES), help="only this suite (repeatable)"
    )
    chk = sub.add_parser("check", help="validate suite folders")
    chk.add_argument("suites", nargs="+")
    args = parser.parse_args(argv)
    if args.cmd == "generate":
        for name in args.suite or sorted(SUITES):
            path = generate_suite(name, args.out, args.seed)
            print(f"{path}: {sum(1 for p in path.iterdir() if p.is_dir())} tasks")
        return 0
    try:  # check
        for s in args.suites:
            print(f"{s}: {len(load_suite(s))} tasks ok")
    except TaskError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
