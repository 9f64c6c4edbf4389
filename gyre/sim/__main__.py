"""`python -m gyre.sim --config examples/sim/<name>.toml`: compare the scheduler policies.

Prints the comparison table (makespan, median step, lower bound, utilisation, switches, staleness)
and writes one timeline PNG per policy under the config's `out_dir`. Everything else about the
scenario lives in the TOML file (`gyre.sim.config.SimConfig`); the CLI has no other options.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gyre.errors import ConfigError
from gyre.report.gantt import plot_timeline
from gyre.sim.comparison import compare, format_table
from gyre.sim.config import load_sim_config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gyre.sim", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--config", required=True, help="simulator TOML, e.g. examples/sim/122b-longtail.toml"
    )
    args = parser.parse_args(argv)
    try:
        config = load_sim_config(args.config)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    comp = compare(config)
    print(format_table(comp))
    if comp.async_splits:
        splits = ", ".join(f"{t}: {s / 3600:.1f}" for t, s in sorted(comp.async_splits.items()))
        print(f"async makespan (h) by training cells: {splits}")
    for name, result in comp.results.items():
        path = plot_timeline(
            result.timeline,
            config.cluster.num_cells,
            Path(config.out_dir) / f"timeline-{name}.png",
            title=f"{config.name} / {name}: makespan {result.makespan_s / 3600:.2f} h, "
            f"utilisation {result.utilisation:.2f}",
        )
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
