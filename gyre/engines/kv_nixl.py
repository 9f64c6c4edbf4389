"""vLLM's `NixlConnector` for gyre's KV migration, with NIXL's idle progress thread turned off.

vLLM loads the connector from here (`kv_connector_module_path="gyre.engines.kv_nixl"`, class name
`NixlConnector`, so vLLM's own checks on that name still apply) in every process that builds one.
Importing this module makes vLLM's NIXL worker create its agents with `enable_prog_thread=False`:
NIXL's default progress thread busy-spins a whole core even when idle, which halves prefill speed
on a CPU cell (`docs/notes/vllm-cpu.md`); pulls still complete (UCX one-sided reads).

Owns nothing else: the connector is vLLM's. Needs the `nixl` package (NIXL wheels); without it
vLLM refuses to start the engine with a clear error.
"""

from __future__ import annotations

import functools

from vllm.distributed.kv_transfer.kv_connector.v1.nixl import base_worker
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.connector import NixlConnector

__all__ = ["NixlConnector"]

if base_worker.nixl_agent_config is not None and not isinstance(
    base_worker.nixl_agent_config, functools.partial
):
    base_worker.nixl_agent_config = functools.partial(
        base_worker.nixl_agent_config, enable_prog_thread=False
    )
