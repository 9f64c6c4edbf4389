"""Run configs: TOML in, frozen typed Structs out; every bad key or value is one clear line."""

from __future__ import annotations

import subprocess
import sys

import msgspec
import pytest

from gyre.config import EngineConfig, ModelConfig, RunConfig, config_from_dict, load_config
from gyre.errors import ConfigError


def write(tmp_path, text: str):
    path = tmp_path / "run.toml"
    path.write_text(text)
    return path


def test_example_config_loads() -> None:
    config = load_config("examples/cpu.toml")
    assert config.engine.backend == "vllm" and config.engine.max_model_len == 4096
    assert config.model.path == "runs/model-tiny"
    assert config.model.init_if_missing and config.warm_start.enabled  # make run builds both


def test_harness_env_is_read_as_written(tmp_path) -> None:
    config = load_config(
        write(
            tmp_path,
            '[tasks.harness]\nenv_passthrough = ["HF_TOKEN"]\n'
            '[tasks.harness.env]\nMSWEA_MODEL_NAME = "hosted_vllm/gyre"\nPATH = "/opt/x:/bin"\n',
        )
    )
    harness = config.tasks.harness
    assert harness.env == {"MSWEA_MODEL_NAME": "hosted_vllm/gyre", "PATH": "/opt/x:/bin"}
    assert harness.env_passthrough == ("HF_TOKEN",)


def test_elastic_example_shares_make_runs_warm_start() -> None:
    """Same model and warm-start settings: the cached runs/model-tiny-sft serves both (other
    settings would retrain it and replace make run's cache)."""
    cpu, elastic = load_config("examples/cpu.toml"), load_config("examples/elastic-cpu.toml")
    assert elastic.warm_start.enabled and (elastic.model, elastic.warm_start) == (
        cpu.model,
        cpu.warm_start,
    )


def test_defaults_and_frozen() -> None:
    config = RunConfig()
    assert config.engine.block_size == 32 and config.cells.num_cells == 1
    # nothing built or fine-tuned unless asked: the tiny model only with init_if_missing, the
    # warm start decided by the model (gyre.job.warm_start_enabled); agents get no extra env
    assert config.model.init_if_missing is False and config.warm_start.enabled is None
    assert (config.tasks.harness.env, config.tasks.harness.env_passthrough) == ({}, ())
    with pytest.raises(AttributeError):
        config.seed = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[engin]\nx = 1\n", "unknown field `engin`"),
        ("[engine]\nmax_tokenz = 3\n", "unknown field `max_tokenz` - at `$.engine`"),
        (
            "[engine]\nmax_model_len = -4\n",
            "max_model_len=-4 must be > 0 - at `$.engine.max_model_len`",
        ),
        (
            "[warm_start]\nslip_fraction = 1.5\n",
            "slip_fraction=1.5 must be in [0, 1) - at `$.warm_start.slip_fraction`",
        ),
        (
            '[engine]\nmax_model_len = "big"\n',
            "Expected `int`, got `str` - at `$.engine.max_model_len`",
        ),
        ('[engine]\nbackend = "tgi"\n', "Invalid enum value 'tgi' - at `$.engine.backend`"),
        ("[model]\nhidden_size = 64\n", "head_dim=16"),
        ("[cells]\nnum_cells = -1\n", "num_cells=-1 must be > 0 - at `$.cells.num_cells`"),
        (
            "[engine]\nstream_interval = 0\n",
            "stream_interval=0 must be > 0 - at `$.engine.stream_interval`",
        ),
        (
            "[loop]\nmax_consecutive_failures = -1\n",
            "max_consecutive_failures=-1 must be >= 0 - at `$.loop.max_consecutive_failures`",
        ),
        ("[cells]\ndevices_per_cell = 0\n", "devices_per_cell=0 must be > 0"),
        (
            "[cells]\ndevices_per_cell = 2\n",
            "cells.devices_per_cell=2 needs trainer.zero_stage = 3 (got 1)",
        ),
        ("seed = [1\n", "not valid TOML"),
        (
            '[tasks.harness.env]\nOPENAI_API_KEY = "sk-mine"\n',
            "env: 'OPENAI_API_KEY' is set by gyre for each execution and cannot be overridden",
        ),
        (
            '[tasks.harness]\nenv_passthrough = ["GYRE_CELL_SECRET"]\n',
            "env_passthrough: 'GYRE_CELL_SECRET' is set by gyre for each execution",
        ),
        (
            '[tasks.harness.env]\n"A-B" = "1"\n',
            "env: 'A-B' is not an environment variable name - at `$.tasks.harness.env`",
        ),
        (  # was a traceback from the mount namespace's check (found by a tester)
            '[tasks.harness]\nvisible_paths = ["/"]\n',
            "visible_paths: '/' is the whole filesystem: name a folder "
            "- at `$.tasks.harness.visible_paths`",
        ),
        ('[tasks.harness]\nhidden_paths = ["//"]\n', "hidden_paths: '//' is the whole filesystem"),
        (  # was refused with a misleading "/root has mode 700"
            '[tasks.harness]\nvisible_paths = ["/root/"]\n',
            "visible_paths and hidden_paths both name '/root': leave it out of hidden_paths",
        ),
        (
            '[tasks.harness]\nenv = {HF_HOME = "/x"}\nenv_passthrough = ["HF_HOME"]\n',
            "env_passthrough=['HF_HOME'] names a variable twice or one `env` sets",
        ),
    ],
)
def test_bad_config_is_one_line_naming_key_and_value(tmp_path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text))
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_missing_file() -> None:
    with pytest.raises(ConfigError, match="cannot read config '/nonexistent/run.toml'"):
        load_config("/nonexistent/run.toml")


def test_config_from_dict_names_path() -> None:
    # a struct's own check is reported at its struct's path by msgspec; gyre extends the path to
    # the field the check names, as msgspec's type errors give it
    cases = {
        "invalid config: block_size=0 must be > 0 - at `$.engine.block_size`": {
            "engine": {"block_size": 0}
        },
        "invalid config: run_dir='' must not be empty - at `$.run_dir`": {"run_dir": ""},
        # the check names a key of two tables: left as msgspec gave it
        "invalid config: cells.devices_per_cell=2 needs trainer.zero_stage = 3 (got 1)": {
            "cells": {"devices_per_cell": 2}
        },
        "invalid config: Expected `int`, got `str` - at `$.cells.num_cells`": {
            "cells": {"num_cells": "2"}
        },
    }
    for message, data in cases.items():
        with pytest.raises(ConfigError) as info:
            config_from_dict(data)
        assert str(info.value) == message


def test_engine_config_round_trips_through_json() -> None:
    config = EngineConfig(max_model_len=512, dtype="bfloat16")
    assert msgspec.json.decode(msgspec.json.encode(config), type=EngineConfig) == config


def test_model_config_validates_at_construction() -> None:
    with pytest.raises(ValueError, match="num_key_value_heads=3 must divide num_attention_heads=4"):
        ModelConfig(num_key_value_heads=3)


def test_node_cli_bad_config_exits_2_with_one_line(tmp_path) -> None:
    path = write(tmp_path, "[engine]\nmax_model_len = 0\n")
    result = subprocess.run(
        [sys.executable, "-m", "gyre.node", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"gyre: error: {path}: max_model_len=0 must be > 0 - at `$.engine.max_model_len`"
    ]


def test_node_cli_bad_task_folder_is_one_clear_error_before_start(tmp_path) -> None:
    bad = tmp_path / "suite" / "broken-task"
    bad.mkdir(parents=True)
    (bad / "task.toml").write_text("version = 1\n[agent]\ndeadline_s = -5\n")
    model = tmp_path / "model"
    path = write(
        tmp_path,
        f'run_dir = "{tmp_path / "run"}"\n[model]\npath = "{model}"\n'
        f'[tasks]\nsuites = ["{tmp_path / "suite"}"]\n',
    )
    result = subprocess.run(
        [sys.executable, "-m", "gyre.node", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()[-1:]
    assert line.startswith("gyre: error: ") and "broken-task" in line
    assert not (tmp_path / "run").exists() and not model.exists()  # nothing built or started
