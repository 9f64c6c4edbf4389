"""`python -m gyre.model init|sft|demos`: write the reference tiny model; warm-start it on
demonstrations.

    python -m gyre.model init DIR [--seed N] [--hidden-size ...]
    python -m gyre.model sft --model DIR --out DIR [--config RUN.toml]
        [--examples N --epochs E --lr LR ...]
    python -m gyre.model demos --out demos.jsonl [--suite-dir examples/tasks/learnable]
        [--count N --seed S]

Owns only argument parsing; the work is in `gyre.model.recipe`, `gyre.model.sft` and
`gyre.agents.oracle` (the demonstrations).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import msgspec

from gyre.config import ModelConfig, WarmStartConfig, load_config

_SFT_FLAGS = (
    ("--examples", "examples", int),
    ("--epochs", "epochs", int),
    ("--lr", "learning_rate", float),
    ("--seed", "seed", int),
    ("--slip-fraction", "slip_fraction", float),
    ("--copy-pretrain-steps", "copy_pretrain_steps", int),
)
"""`gyre.model sft` flags: (flag, `WarmStartConfig` field, type)."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gyre.model",
        description=" ".join(__doc__.split("\n\n")[0].split()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    init = sub.add_parser("init", help="write the tiny model, tokenizer and chat template to DIR")
    init.add_argument("dir")
    for field in msgspec.structs.fields(ModelConfig):
        if field.name in ("path", "init_if_missing"):
            continue
        init.add_argument(f"--{field.name.replace('_', '-')}", type=int, default=field.default)
    defaults = WarmStartConfig()
    sft = sub.add_parser(
        "sft",
        help="fine-tune a model folder on learnable demonstrations (cached)",
        description="Settings come from --config's [warm_start] (else WarmStartConfig's "
        "defaults, shown below); a flag overrides either.",
    )
    sft.add_argument("--model", required=True, help="base Hugging Face model folder")
    sft.add_argument("--out", required=True, help="output model folder")
    sft.add_argument(
        "--config", help="run config (TOML) whose [warm_start] to reproduce, e.g. examples/cpu.toml"
    )
    for flag, name, kind in _SFT_FLAGS:
        sft.add_argument(
            flag,
            dest=name,
            type=kind,
            help=f"warm_start.{name} (default {getattr(defaults, name)})",
        )
    demos = sub.add_parser("demos", help="write demonstration conversations (JSON lines) for SFT")
    demos.add_argument("--out", required=True)
    demos.add_argument("--suite-dir", help="one demonstration per task of this suite")
    demos.add_argument("--count", type=int, default=0, help="fresh learnable examples to add")
    demos.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    if args.command == "sft":
        return _sft(args)
    if args.command == "demos":
        return _demos(args)
    from gyre.model.recipe import init_model_dir

    values = {
        f.name: getattr(args, f.name)
        for f in msgspec.structs.fields(ModelConfig)
        if hasattr(args, f.name)
    }
    try:
        config = ModelConfig(path=args.dir, **values)
        path = init_model_dir(args.dir, config)
    except (ValueError, FileExistsError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    return 0


def _sft(args: argparse.Namespace) -> int:
    from gyre.model.sft import SFT_RECORD, SFTResult, warm_start

    t0 = time.perf_counter()
    try:
        base = load_config(args.config).warm_start if args.config else WarmStartConfig()
        given = {
            name: getattr(args, name)
            for _flag, name, _kind in _SFT_FLAGS
            if getattr(args, name) is not None
        }
        settings = WarmStartConfig(**{**msgspec.structs.asdict(base), **given})
        path = warm_start(args.model, args.out, settings, log=lambda line: print(line, flush=True))
    except (ValueError, FileNotFoundError, FileExistsError) as exc:  # ConfigError is a ValueError
        print(f"error: {exc}", file=sys.stderr)
        return 2
    record = msgspec.json.decode((path / SFT_RECORD).read_bytes(), type=SFTResult)
    print(
        f"{path}: {record.steps} steps, final loss {record.losses[-1]:.4f}, "
        f"trained in {record.wall_s:.0f} s "
        f"(this call {time.perf_counter() - t0:.1f} s)"
    )
    return 0


def _demos(args: argparse.Namespace) -> int:
    from gyre.agents.oracle import demonstration, demonstration_for
    from gyre.tasks.suites import learnable_examples
    from gyre.tasks.task import load_suite

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
