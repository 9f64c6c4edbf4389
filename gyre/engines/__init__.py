"""Inference and training engines behind one protocol each (see `protocol.py`).

`InferenceEngine`: `ScriptedEngine` (deterministic fake for tests above the engine) and
`VLLMEngine` (vLLM's AsyncLLM, runs inside a cell worker process); `gyre.runtime`'s `CellClient`
(the node's view of a cell) implements it too. `Trainer`: `DeepSpeedTrainer` (`trainer.py`, a
DeepSpeed ZeRO engine), which trains with the `Objective` its caller hands it. The backends are
imported from their modules, not from here: importing this package needs neither vLLM nor torch.
"""

from gyre.engines.protocol import (
    AccumulateStatistics,
    Completion,
    EngineStatistics,
    FinishReason,
    GenerateRequest,
    InferenceEngine,
    KVExport,
    KVTransferEngine,
    MicroBatch,
    Objective,
    ObjectiveStatistics,
    SamplingParams,
    StepStatistics,
    TokenDelta,
    Trainer,
    TrainerStatistics,
    TrainStatistics,
    choice_seed,
    collect,
)

__all__ = [
    "AccumulateStatistics",
    "Completion",
    "EngineStatistics",
    "FinishReason",
    "GenerateRequest",
    "InferenceEngine",
    "KVExport",
    "KVTransferEngine",
    "MicroBatch",
    "Objective",
    "ObjectiveStatistics",
    "SamplingParams",
    "StepStatistics",
    "TokenDelta",
    "Trainer",
    "TrainerStatistics",
    "TrainStatistics",
    "choice_seed",
    "collect",
]
