"""Metric sinks (`gyre.runtime.sinks`): a 3-step elastic run over cell doubles streams every step
metric to TensorBoard, read back with TensorBoard's own `EventAccumulator` and equal, float for
float, to `metrics.jsonl`; the runtime's statistics records go along. W&B offline: the run folder
holds the offline run, whose history rows and summary (read from wandb's own transaction log with
wandb's protobuf records) equal `metrics.jsonl`. A bad `[report]` is one `ConfigError` naming the
key; a configured sink whose package is missing stops the preflight.
"""

from __future__ import annotations

import csv
import json
import math
import struct
import sys
from pathlib import Path

import msgspec
import pytest

from gyre.config import ReportConfig, config_from_dict, load_config
from gyre.errors import ConfigError
from gyre.model.recipe import build_tokenizer
from gyre.report.page import TREES_CSV, write_report
from gyre.runtime.metrics import METRICS_FILE, EvalMetrics, MetricsWriter, StepMetrics
from gyre.runtime.sinks import TENSORBOARD_DIR, WANDB_DIR, TensorBoardSink, flatten, wandb_mode
from tests.runtime.test_elastic import REPO, drive, make_cells
from tests.runtime.test_elastic import config as elastic_config

pytest.importorskip("tensorboard", reason="tensorboard (a gyre dependency) is not installed")


def jsonl_steps(run_dir: Path) -> list[dict]:
    """The step records of metrics.jsonl as plain JSON (null = NaN), independent of msgspec."""
    lines = (run_dir / METRICS_FILE).read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["type"] == "step"]


def as_float(value) -> float:
    return math.nan if value is None else float(value)


def same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def read_tensorboard(log_dir: Path) -> dict[str, dict[int, float]]:
    """tag -> step -> value, read with TensorBoard's EventAccumulator (every event kept)."""
    from tensorboard.backend.event_processing.event_accumulator import TENSORS, EventAccumulator
    from tensorboard.util import tensor_util

    acc = EventAccumulator(str(log_dir), size_guidance={TENSORS: 0})
    acc.Reload()
    return {
        tag: {e.step: tensor_util.make_ndarray(e.tensor_proto).item() for e in acc.Tensors(tag)}
        for tag in acc.Tags()["tensors"]
    }


async def run_three_steps(tmp_path: Path, sinks: tuple[str, ...]) -> tuple[Path, list]:
    """(run folder, the execution ids each optimizer step trained, from the core cell double)."""
    cfg = elastic_config(tmp_path / "run", "async")
    cfg = msgspec.structs.replace(cfg, report=ReportConfig(sinks=sinks, wandb_mode="offline"))
    fakes = make_cells(build_tokenizer())
    await drive(cfg, fakes)
    return tmp_path / "run", [sorted(grads) for grads in fakes[0].steps]


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["trio"])  # slow tier: the node's backend only
async def test_tensorboard_event_file_holds_the_step_metrics_of_metrics_jsonl(tmp_path) -> None:
    run_dir, trained = await run_three_steps(tmp_path, ("tensorboard",))
    steps = jsonl_steps(run_dir)
    assert [s["step"] for s in steps] == [1, 2, 3]
    events = list((run_dir / TENSORBOARD_DIR).glob("events.out.tfevents.*"))
    assert len(events) == 1
    board = read_tensorboard(run_dir / TENSORBOARD_DIR)
    fields = [f for f in steps[0] if f not in ("type", "step")]
    assert len(fields) == len(msgspec.structs.fields(StepMetrics)) - 1  # every field but `step`
    for record in steps:
        for field in fields:
            got = board[f"step/{field}"][record["step"]]
            want = as_float(record[field])  # `applied` true -> 1.0
            assert same(got, want), (record["step"], field, got, want)
    # branches: the leaves of the trained executions' trees, as the static report counts them
    write_report(run_dir)
    with open(run_dir / "report" / TREES_CSV) as f:
        tree_branches = {row["execution_id"]: int(row["branches"]) for row in csv.DictReader(f)}
    for record, ids in zip(steps, trained, strict=True):
        assert len(ids) == 4
        assert record["branches"] == sum(tree_branches[i] for i in ids) >= 4, (record, ids)
    # the runtime's statistics records, at every step; counters never go down
    for tag in (
        "stats/router/requests_routed",
        "stats/proxy/calls_recorded",
        "stats/harness/finished",
        "stats/weights/version",
    ):
        assert sorted(board[tag]) == [1, 2, 3], tag
        values = [board[tag][s] for s in (1, 2, 3)]
        assert values == sorted(values), (tag, values)
    assert [board["stats/weights/version"][s] for s in (1, 2, 3)] == [1.0, 2.0, 3.0]
    # the driver's own counters: `async` keeps 1 training and 2 rollout cells, never switching
    for tag, value in (
        ("cells_dead", 0.0),
        ("cells_train", 1.0),
        ("cells_rollout", 2.0),
        ("rollout_capacity", 4.0),
        ("switches", 0.0),
        ("suspensions", 0.0),
    ):
        assert board[f"stats/runtime/{tag}"] == {1: value, 2: value, 3: value}, tag
    for s in (1, 2, 3):
        level = board["stats/runtime/water_level"][s]
        assert level == board["stats/runtime/dispatched"][s] - board["stats/runtime/finished"][s]
        assert board["stats/runtime/finished"][s] >= 4 * s  # every trained execution finished
    calls = sum(s["model_calls"] for s in steps)
    assert board["stats/proxy/calls_recorded"][3] >= calls  # later executions may have started


def read_wandb_log(path: Path) -> list:
    """The records of a wandb transaction log (`run-<id>.wandb`): a 7-byte `:W&B` header, then
    LevelDB log blocks of 32 KiB whose chunks (7-byte header: crc, length, type full / first /
    middle / last) carry `wandb_internal_pb2.Record` messages."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    records, pending, pos, block = [], b"", 7, 32768
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # the block's tail is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack_from("<IHB", data, pos)
        if kind == 0 and length == 0:
            pos += left
            continue
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):  # full or last: a whole record
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def _items(items) -> dict[str, float]:
    out = {}
    for item in items:
        value = json.loads(item.value_json.replace("NaN", "null"))  # wandb writes NaN bare
        out["/".join(item.nested_key) or item.key] = as_float(value)
    return out


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["trio"])  # slow tier: the node's backend only
async def test_wandb_offline_run_in_the_run_folder_holds_the_step_metrics(tmp_path: Path) -> None:
    pytest.importorskip("wandb", reason="wandb is not installed (pip install gyre[wandb])")
    run_dir, _ = await run_three_steps(tmp_path, ("wandb",))
    logs = list((run_dir / WANDB_DIR / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(logs) == 1, logs
    records = read_wandb_log(logs[0])
    history = {}
    summary: dict[str, float] = {}
    for r in records:
        kind = r.WhichOneof("record_type")
        if kind == "history":
            row = _items(r.history.item)
            history[int(row["_step"])] = row
        elif kind == "summary":
            summary.update(_items(r.summary.update))
    steps = jsonl_steps(run_dir)
    assert sorted(history) == [1, 2, 3]
    for record in steps:
        row = history[record["step"]]
        for field, value in record.items():
            if field not in ("type", "step"):
                assert same(row[f"step/{field}"], as_float(value)), (record["step"], field)
        assert row["stats/weights/version"] == record["version"]
    last = steps[-1]
    for field in ("pass_rate", "mean_reward", "executions", "branches", "dedup_ratio", "step_s"):
        assert same(summary[f"step/{field}"], as_float(last[field])), field


def test_evaluations_and_statistics_reach_tensorboard_exactly(tmp_path: Path) -> None:
    """Written straight through a `MetricsWriter`: an evaluation goes under eval/<split>/ at its
    step, nested and boolean statistics fields are flattened, strings are left out."""
    step = StepMetrics(
        step=1,
        version=1,
        executions=4,
        pass_rate=0.1 + 0.2,
        mean_reward=math.nan,
        finished=4,
        partial=0,
        failed=0,
        truncated=0,
        model_calls=8,
        branches=5,
        policy_tokens=17,
        packed_tokens=30,
        dedup_ratio=1 / 3,
        logprob_abs_diff_mean=1e-7,
        mean_ratio=1.0000001,
        applied=False,
        rollout_s=1.5,
        train_s=0.25,
        sync_s=0.125,
        step_s=2.0,
    )
    evaluation = EvalMetrics(
        step=1,
        version=1,
        split="heldout",
        executions=16,
        pass_rate=0.4375,
        mean_reward=0.5,
        eval_s=3.0,
    )
    stats = {"cell": {"paused": True, "inner": {"tokens": 12}, "name": "cell-0"}}
    with MetricsWriter(tmp_path, [TensorBoardSink(tmp_path / "tb")]) as writer:
        writer.write(
            EvalMetrics(
                step=0,
                version=0,
                split="heldout",
                executions=16,
                pass_rate=0.25,
                mean_reward=0.25,
                eval_s=3.0,
            )
        )
        writer.write(step, stats)
        writer.write(evaluation)
    board = read_tensorboard(tmp_path / "tb")
    assert board["step/pass_rate"] == {1: 0.1 + 0.2}
    assert math.isnan(board["step/mean_reward"][1])
    assert board["step/dedup_ratio"] == {1: 1 / 3} and board["step/applied"] == {1: 0.0}
    assert board["eval/heldout/pass_rate"] == {0: 0.25, 1: 0.4375}
    assert board["stats/cell/paused"] == {1: 1.0} and board["stats/cell/inner/tokens"] == {1: 12.0}
    assert "stats/cell/name" not in board and "step/step" not in board
    assert "eval/heldout/step" not in board and "eval/heldout/split" not in board


def test_flatten_and_wandb_mode() -> None:
    assert flatten({"a": 1, "b": {"c": False, "d": None}, "e": "x", "f": [1]}, "p") == {
        "p/a": 1.0,
        "p/b/c": 0.0,
        "p/b/d": pytest.approx(math.nan, nan_ok=True),
    }
    assert wandb_mode("auto", {}) == "offline"
    assert wandb_mode("auto", {"WANDB_API_KEY": "k"}) == "online"
    assert wandb_mode("auto", {"WANDB_API_KEY": "k", "WANDB_MODE": "offline"}) == "offline"
    assert wandb_mode("online", {}) == "online"


def test_an_unknown_sink_is_one_config_error_naming_the_key(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text('[report]\nsinks = ["tensorboard", "mlflow"]\n')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert "$.report.sinks[1]" in message and "mlflow" in message and "\n" not in message
    with pytest.raises(ConfigError, match=r"sinks=\['wandb', 'wandb'\] names a sink twice"):
        config_from_dict({"report": {"sinks": ["wandb", "wandb"]}})


def test_a_sink_whose_package_is_missing_stops_the_preflight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gyre.job import preflight

    cfg = config_from_dict(
        {
            "run_dir": str(tmp_path / "run"),
            "tasks": {"suites": [str(REPO / "examples/tasks/learnable")]},
            "warm_start": {"enabled": False},
            "report": {"sinks": ["tensorboard", "wandb"]},
        }
    )
    monkeypatch.setitem(sys.modules, "wandb", None)  # what Python does for a package not installed
    with pytest.raises(ConfigError, match=r"report.sinks: 'wandb' needs the 'wandb' package"):
        preflight(cfg, resume=False)
    assert not (tmp_path / "run").exists()  # nothing was built or started
