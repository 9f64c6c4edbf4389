"""`gyre.sandbox.uids`: which uids a user namespace maps (the switch itself is tried for real in
`tests/test_job.py`, under `unshare -r` and without CAP_SETUID)."""

from __future__ import annotations

from pathlib import Path

from gyre.sandbox.uids import _unmapped


def test_the_first_unmapped_id_across_the_maps_spans(tmp_path: Path) -> None:
    """`inside outside count` lines, in any order: 0-11 and 15-24 mapped, 12-14 a hole."""
    path = tmp_path / "uid_map"
    path.write_text("        15     100015         10\n         0          0         12\n")
    assert _unmapped(range(0, 12), str(path)) is None
    assert _unmapped(range(15, 25), str(path)) is None
    assert _unmapped(range(10, 20), str(path)) == 12
    assert _unmapped(range(20, 26), str(path)) == 25
    assert _unmapped(range(30, 31), str(path)) == 30
    path.write_text("0 0 4294967295\n")  # the initial namespace
    assert _unmapped(range(200_000, 204_096), str(path)) is None
