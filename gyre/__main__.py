"""`python -m gyre`: there is no single command; this names the ones there are and exits 2."""

from __future__ import annotations

import sys

USAGE = """usage: python -m gyre.<command> ...

  python -m gyre.node --config FILE [--resume]   run one node's job (examples/*.toml)
  python -m gyre.report RUN_DIR                  plots and a summary of a run
  python -m gyre.model init DIR | sft | demos    build the tiny model; warm-start it
  python -m gyre.sim --config FILE               the discrete-event cluster simulator
"""

if __name__ == "__main__":
    print(USAGE, end="", file=sys.stderr)
    sys.exit(2)
