"""Inference and training engines behind one protocol each (see `protocol.py`).

Backends: `ScriptedEngine` (deterministic fake for tests above the engine), `VLLMEngine` (vLLM's
AsyncLLM, runs inside a cell worker process) and `CellClient` (the node's view of a cell).
"""

from gyre.engines.protocol import (
    Completion,
    EngineStatistics,
    FinishReason,
    GenerateRequest,
    InferenceEngine,
    KVExport,
    KVTransferEngine,
    SamplingParams,
    TokenDelta,
    choice_seed,
    collect,
)

__all__ = [
    "Completion",
    "EngineStatistics",
    "FinishReason",
    "GenerateRequest",
    "InferenceEngine",
    "KVExport",
    "KVTransferEngine",
    "SamplingParams",
    "TokenDelta",
    "choice_seed",
    "collect",
]
