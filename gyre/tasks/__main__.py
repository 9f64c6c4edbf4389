"""`python -m gyre.tasks`: generate the shipped suites, validate suites, write demonstrations.

    python -m gyre.tasks generate --out examples/tasks --seed 0 [--suite NAME]
    python -m gyre.tasks check examples/tasks/nl2repo-mini [...]
    python -m gyre.tasks demos --out demos.jsonl [--suite-dir examples/tasks/learnable] [--count N --seed S]

Owns only argument parsing; the work is in `suites`, `task` and `gyre.agents.oracle`.
"""

from __future__ import annotations

import argparse
import json
import sys

from gyre.errors import TaskError
from gyre.tasks.suites import SUITES, generate_suite, learnable_examples
from gyre.tasks.task import load_suite


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gyre.tasks")
    sub = parser.add_subparsers(dest="cmd", required=True)
    gen = sub.add_parser("generate", help="write the shipped suites from a seed")
    gen.add_argument("--out", default="examples/tasks")
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--suite", action="append", choices=sorted(SUITES), help="only this suite (repeatable)")
    chk = sub.add_parser("check", help="validate suite folders")
    chk.add_argument("suites", nargs="+")
    demos = sub.add_parser("demos", help="write demonstration conversations (JSON lines) for SFT")
    demos.add_argument("--out", required=True)
    demos.add_argument("--suite-dir", help="one demonstration per task of this suite")
    demos.add_argument("--count", type=int, default=0, help="fresh learnable examples to add")
    demos.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    if args.cmd == "generate":
        for name in args.suite or sorted(SUITES):
            path = generate_suite(name, args.out, args.seed)
            print(f"{path}: {sum(1 for p in path.iterdir() if p.is_dir())} tasks")
        return 0
    if args.cmd == "check":
        try:
            for s in args.suites:
                print(f"{s}: {len(load_suite(s))} tasks ok")
        except TaskError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        return 0
    from gyre.agents.oracle import demonstration, demonstration_for  # agents depend on tasks, not back

    n = 0
    with open(args.out, "w") as f:
        if args.suite_dir:
            for task in load_suite(args.suite_dir):
                f.write(json.dumps(demonstration(task)) + "\n")
                n += 1
        for instruction, solution in learnable_examples(args.count, args.seed):
            f.write(json.dumps(demonstration_for(instruction, solution)) + "\n")
            n += 1
    print(f"{args.out}: {n} demonstrations")
    return 0


if __name__ == "__main__":
    sys.exit(main())
