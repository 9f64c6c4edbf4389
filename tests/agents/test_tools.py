"""Workspace tools: confined to the workspace; escapes are clear tool errors and change nothing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gyre.agents.tools import ToolError, Workspace


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "a.txt").write_text("hello")
    (tmp_path / "secret.txt").write_text("secret")
    os.symlink(tmp_path / "secret.txt", root / "link_out")
    os.symlink(tmp_path, root / "dir_out")
    os.symlink("a.txt", root / "link_in")
    return Workspace(root, command_timeout_s=1.0, max_read_chars=100)


def test_reads_writes_and_lists_inside(ws: Workspace) -> None:
    assert ws.read_file("a.txt") == "hello"
    assert ws.read_file("link_in") == "hello"
    assert ws.write_file("pkg/sub/m.py", "x = 1\n") == "wrote 6 characters to pkg/sub/m.py"
    assert (ws.root / "pkg" / "sub" / "m.py").read_text() == "x = 1\n"
    assert ws.list_dir(".") == "a.txt\ndir_out/\nlink_in\nlink_out\npkg/"
    assert ws.read_file(str(ws.root / "a.txt")) == "hello"  # an absolute path inside is fine


@pytest.mark.parametrize(
    "call",
    [
        lambda ws: ws.read_file("../secret.txt"),
        lambda ws: ws.read_file("/etc/passwd"),
        lambda ws: ws.read_file("link_out"),
        lambda ws: ws.read_file("dir_out/secret.txt"),
        lambda ws: ws.write_file("../evil.txt", "x"),
        lambda ws: ws.write_file("dir_out/evil.txt", "x"),
        lambda ws: ws.write_file("link_out", "overwritten"),
        lambda ws: ws.write_file("pkg/../../evil.txt", "x"),
        lambda ws: ws.list_dir(".."),
        lambda ws: ws.list_dir("dir_out"),
    ],
)
def test_path_escapes_are_refused(ws: Workspace, call) -> None:
    outside = ws.root.parent
    before = sorted(p.name for p in outside.iterdir())
    with pytest.raises(ToolError, match="is outside the workspace"):
        call(ws)
    assert sorted(p.name for p in outside.iterdir()) == before
    assert (outside / "secret.txt").read_text() == "secret"


def test_other_tool_errors(ws: Workspace) -> None:
    with pytest.raises(ToolError, match="no such file: nope.txt"):
        ws.read_file("nope.txt")
    with pytest.raises(ToolError, match="invalid path ''"):
        ws.read_file("")
    with pytest.raises(ToolError, match="is a folder"):
        ws.write_file(".", "x")
    with pytest.raises(ToolError, match="no such folder"):
        ws.list_dir("a.txt")


def test_read_is_truncated(ws: Workspace) -> None:
    ws.write_file("big.txt", "x" * 150)
    assert ws.read_file("big.txt") == "x" * 100 + "\n[... 50 more characters]"


def test_run_in_the_workspace_with_a_timeout(ws: Workspace) -> None:
    assert ws.run("cat a.txt; echo; exit 3") == "exit code 3\nhello\n"
    assert ws.run("pwd").split("\n")[1] == str(ws.root)
    with pytest.raises(ToolError, match="timed out after 1.0 s"):
        ws.run("echo started; sleep 30")
    with pytest.raises(ToolError, match="non-empty"):
        ws.run("  ")
