"""`python -m gyre.sim --config FILE`: table on stdout, one timeline PNG per policy."""

from __future__ import annotations

import types

import gyre.sim
from gyre.sim.__main__ import main


def test_cli_prints_the_table_and_writes_timelines(tmp_path, capsys) -> None:
    config = tmp_path / "small.toml"
    config.write_text(
        f'name = "small"\nout_dir = "{tmp_path / "out"}"\n'
        "[cluster]\nnum_cells = 4\nkv_cache_bytes_per_cell = 400e9\n"
        "[workload]\nnum_steps = 3\nbatch_executions = 32\ngroup_size = 8\n"
    )
    assert main(["--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "policy" in out and "colocate" in out and "elastic" in out and "async(" in out
    for name in ("colocate", "async", "elastic"):
        png = tmp_path / "out" / f"timeline-{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_reports_a_bad_config(tmp_path, capsys) -> None:
    config = tmp_path / "bad.toml"
    config.write_text("[cluster]\nnum_cells = 0\n")
    assert main(["--config", str(config)]) == 2
    assert "num_cells=0" in capsys.readouterr().err


def test_sim_exports_exactly_its_all() -> None:
    public = {
        n
        for n in dir(gyre.sim)
        if not n.startswith("_") and not isinstance(getattr(gyre.sim, n), types.ModuleType)
    }
    assert public == set(gyre.sim.__all__)
