"""`python -m gyre`: there is no single command; this names the ones there are and exits 2."""

from __future__ import annotations

import sys

USAGE = """usage: python -m gyre.<command> ...

  python -m gyre.node --config FILE [--resume]   run one node's job (examples/*.toml)
  python -m gyre.node --join HEAD:PORT           a worker host: offer its cells to a head
  python -m gyre.gateway --config FILE           the job, executions claimed by your own loops
  python -m gyre.report RUN_DIR                  plots and a summary of a run
  python -m gyre.model init DIR | sft | demos    build the tiny model; warm-start it
  python -m gyre.sim --config FILE               the discrete-event cluster simulator
  python -m gyre.tasks generate | check ...      generate the shipped suites; validate suites
"""

if __name__ == "__main__":
    print(USAGE, end="", file=sys.stderr)
    sys.exit(2)
