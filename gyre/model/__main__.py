"""`python -m gyre.model init|sft`: write the reference tiny model; warm-start it on demonstrations.

    python -m gyre.model init DIR [--seed N] [--hidden-size ...]
    python -m gyre.model sft --model DIR --out DIR [--examples N --epochs E --lr LR --seed S]

Owns only argument parsing; the work is in `gyre.model.recipe` and `gyre.model.sft`.
"""

from __future__ import annotations

import argparse
import sys
import time

import msgspec

from gyre.config import ModelConfig, WarmStartConfig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gyre.model", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    init = sub.add_parser("init", help="write the tiny model, tokenizer and chat template to DIR")
    init.add_argument("dir")
    for field in msgspec.structs.fields(ModelConfig):
        if field.name in ("path", "init_if_missing"):
            continue
        init.add_argument(f"--{field.name.replace('_', '-')}", type=int, default=field.default)
    defaults = WarmStartConfig()
    sft = sub.add_parser("sft", help="fine-tune a model folder on learnable demonstrations (cached)")
    sft.add_argument("--model", required=True, help="base Hugging Face model folder")
    sft.add_argument("--out", required=True, help="output model folder")
    sft.add_argument("--examples", type=int, default=defaults.examples)
    sft.add_argument("--epochs", type=int, default=defaults.epochs)
    sft.add_argument("--lr", type=float, default=defaults.learning_rate)
    sft.add_argument("--seed", type=int, default=defaults.seed)
    sft.add_argument("--slip-fraction", type=float, default=defaults.slip_fraction,
                     help="share of demonstrations whose word the teacher writes with a trailing full stop")
    args = parser.parse_args(argv)
    if args.command == "sft":
        return _sft(args)
    from gyre.model.recipe import init_model_dir

    values = {f.name: getattr(args, f.name) for f in msgspec.structs.fields(ModelConfig) if hasattr(args, f.name)}
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
        settings = WarmStartConfig(examples=args.examples, epochs=args.epochs, learning_rate=args.lr, seed=args.seed,
                                   slip_fraction=args.slip_fraction)
        path = warm_start(args.model, args.out, settings, log=lambda line: print(line, flush=True))
    except (ValueError, FileNotFoundError, FileExistsError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    record = msgspec.json.decode((path / SFT_RECORD).read_bytes(), type=SFTResult)
    print(f"{path}: {record.steps} steps, final loss {record.losses[-1]:.4f}, trained in {record.wall_s:.0f} s "
          f"(this call {time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
