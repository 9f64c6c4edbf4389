"""DeepSpeed start-up compiles nothing: its CPU accelerator's shared-memory all-reduce
(`SHM_OP`, 30-55 s of C++ here, and a build lock a killed start left once hung every later trainer
start in CI) is for tensor-parallel inference only, so `init_process_group` keeps DeepSpeed from
building it, and ZeRO's collectives still work over gloo."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gyre.engines.ds_setup import SHM_OP

pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (pip install -e .[cpu])")

_CHILD = """
import torch
import deepspeed.comm as dist
from gyre.engines.ds_setup import init_process_group

init_process_group()
t = torch.tensor([3.0, -1.5])
dist.all_reduce(t)
print(dist.get_world_size(), t.tolist())
"""


def test_start_builds_no_op_and_all_reduce_works(tmp_path):
    """In a fresh process with an empty extensions folder: the group forms, an all-reduce over its
    one rank returns the tensor unchanged, and the folder stays empty (the op was neither built
    nor loaded from an earlier build)."""
    ext = tmp_path / "ext"
    ext.mkdir()
    out = _run_child(_CHILD, ext)
    assert out.stdout.splitlines()[-1] == "1 [3.0, -1.5]"
    assert list(ext.iterdir()) == []


_CHILD_AT_EXIT = """
import atexit
import torch
from gyre.engines.ds_setup import init_process_group

atexit.register(lambda: print("at exit, group alive:", torch.distributed.is_initialized()))
init_process_group()
init_process_group()  # a second call registers no second hook
print("group alive:", torch.distributed.is_initialized())
"""


def test_the_group_is_destroyed_at_exit(tmp_path):
    """The (gloo) group is gone by the time an exit hook registered before `init_process_group`
    runs (`atexit` runs hooks last in, first out): a gloo group left alive can abort the process
    in C++ teardown ("terminate called without an active exception", 1 start in 120 on
    2026-12-07)."""
    out = _run_child(_CHILD_AT_EXIT, tmp_path)
    assert out.stdout.splitlines()[-2:] == ["group alive: True", "at exit, group alive: False"]


def _run_child(code: str, extensions_dir) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter with no launcher variables; fails with its stderr when it
    exits non-zero."""
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(extensions_dir))
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        env.pop(key, None)
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, timeout=300, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def test_the_op_named_is_deepspeeds_shared_memory_all_reduce():
    """`SHM_OP` is the name DeepSpeed's CPU builder gives the op (a rename would leave the switch
    pointing at nothing)."""
    from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder

    assert ShareMemCommBuilder.NAME == SHM_OP
