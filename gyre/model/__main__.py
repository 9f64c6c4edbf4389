"""`python -m gyre.model init DIR [--seed N] [--hidden-size ...]`: write the reference tiny model."""

from __future__ import annotations

import argparse
import sys

import msgspec

from gyre.config import ModelConfig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gyre.model", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    init = sub.add_parser("init", help="write the tiny model, tokenizer and chat template to DIR")
    init.add_argument("dir")
    for field in msgspec.structs.fields(ModelConfig):
        if field.name in ("path", "init_if_missing"):
            continue
        init.add_argument(f"--{field.name.replace('_', '-')}", type=int, default=field.default)
    args = parser.parse_args(argv)
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


if __name__ == "__main__":
    sys.exit(main())
