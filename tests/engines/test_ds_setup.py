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
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(ext))
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        env.pop(key, None)
    out = subprocess.run(
        [sys.executable, "-c", _CHILD],
        env=env,
        check=True,
        timeout=300,
        capture_output=True,
        text=True,
    )
    assert out.stdout.splitlines()[-1] == "1 [3.0, -1.5]"
    assert list(ext.iterdir()) == []


def test_the_op_named_is_deepspeeds_shared_memory_all_reduce():
    """`SHM_OP` is the name DeepSpeed's CPU builder gives the op (a rename would leave the switch
    pointing at nothing)."""
    from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder

    assert ShareMemCommBuilder.NAME == SHM_OP
