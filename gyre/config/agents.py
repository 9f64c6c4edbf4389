"""Configs of the agents' side: the TITO proxy, the harness that runs agents, the task suites.

Owns `ProxyConfig`, `HarnessConfig` (commands, limits, isolation, the agents' environment:
`check_agent_env`, `AGENT_ENV_OWNED`) and `TaskConfig` (suites,
splits). Knows nothing about cells, training or the file format.
"""

from __future__ import annotations

import math
import re
from typing import Literal

from gyre.config.base import Config, check_positive

__all__ = ["ProxyConfig", "HarnessConfig", "TaskConfig", "AGENT_ENV_OWNED", "check_agent_env"]


class ProxyConfig(Config, frozen=True):
    """The TITO proxy: the OpenAI-compatible endpoint agents talk to (`gyre.tito.proxy`)."""

    host: str = "127.0.0.1"
    """Address the proxy binds to."""
    port: int = 0
    """TCP port; 0 picks a free one (the bound port is reported when serving starts)."""
    model_name: str = "gyre"
    """Model name served at /v1/models and written into responses; requests naming a model that
    is neither this nor one of `model_aliases` get 404 `model_not_found`."""
    model_aliases: tuple[str, ...] = ()
    """More names accepted for the served model (e.g. a client's built-in default such as
    `gpt-4o` or `claude-sonnet-4-5`); listed at /v1/models."""
    accept_any_model: bool = False
    """Accept every model name (for agents whose model name cannot be configured)."""
    tool_parser: str = "gyre"
    """How tool calls are parsed from replies: `gyre` (the tiny model's `<tool_call>{json}`
    blocks) or the name of one of vLLM's tool parsers (`hermes`, `llama3_json`, `mistral`,
    `deepseek_v3`, ...: `vllm serve --tool-call-parser`); checked when the proxy starts
    (`gyre.tito.model_format`)."""
    reasoning_parser: str = "gyre"
    """How reasoning is parsed from replies: `gyre` (`<think>...</think>` at the start), `none`,
    or the name of one of vLLM's reasoning parsers (`qwen3`, `deepseek_r1`, ...)."""
    max_body_bytes: int = 16 * 2**20
    """Largest request body accepted; larger ones get 413 (a 1M-token history is ~4-5 MB of
    JSON)."""
    max_n: int = 16
    """Most choices per request."""
    context_overflow: Literal["clamp", "refuse"] = "clamp"
    """prompt + max_tokens over the engine's max_model_len: clamp max_tokens (finish `length` when
    reached) or refuse with a `context_length_exceeded` error (field case B15)."""
    history: Literal["heal", "as_sent"] = "heal"
    """A chat history that differs from the recorded calls only by client habits (reasoning
    dropped, tool-call arguments re-serialised, U+FFFD echoed for invalid UTF-8, the last reply
    of an abandoned branch left out: `gyre.tito.heal`) reuses the recorded tokens (`heal`), or
    branches at the first differing token like any other change (`as_sent`)."""
    render_check_every: int = 0
    """Cross-check every k-th incrementally rendered prompt against a full render; 0: only the
    first of each execution."""
    retry_window_s: float = 30.0
    """A call whose clients all left (a timeout, a dropped stream) is held this long, in seconds,
    for the client's retry of the same request: a retry within it is one logical call, and the
    partial sample is not recorded (`gyre.tito.inflight.InFlight`); the window's end, or the
    execution's, records it; 0 records it at once. The openai SDK retries after 0.5-8 s of
    backoff."""
    flush_interval_s: float = 5.0
    """fsync the call log this often (calls reach the OS before each response completes)."""
    log_name: str = "calls.log"
    """Call log file name under `<run_dir>/`."""

    def __post_init__(self) -> None:
        check_positive(
            max_body_bytes=self.max_body_bytes,
            max_n=self.max_n,
            flush_interval_s=self.flush_interval_s,
        )
        if not 0 <= self.port < 65536:
            raise ValueError(f"port={self.port} must be in [0, 65535]")
        if self.history not in ("heal", "as_sent"):
            raise ValueError(f"history={self.history!r} must be 'heal' or 'as_sent'")
        if self.render_check_every < 0:
            raise ValueError(f"render_check_every={self.render_check_every} must be >= 0")
        if not (math.isfinite(self.retry_window_s) and self.retry_window_s >= 0):
            raise ValueError(f"retry_window_s={self.retry_window_s} must be a finite number >= 0")
        names = self.served_names
        if any(not n for n in names) or len(set(names)) != len(names):
            raise ValueError(
                f"model_name and model_aliases must be distinct non-empty names, got {names}"
            )

    @property
    def served_names(self) -> tuple[str, ...]:
        """`model_name` then `model_aliases`."""
        return (self.model_name, *self.model_aliases)


AGENT_ENV_OWNED = frozenset(
    {
        "OPENAI_BASE_URL",
        "OPENAI_API_BASE",
        "OPENAI_API_KEY",
        "OPENAI_MODEL",
        "ANTHROPIC_BASE_URL",
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_MODEL",
        "HOME",
        "TMPDIR",
    }
)
"""Variables the harness sets for each execution (`gyre.agents.environment`), which
`HarnessConfig.env` and `env_passthrough` may not name; every `GYRE_*` name is gyre's too."""

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def check_agent_env(env: dict[str, str], passthrough: tuple[str, ...]) -> None:
    """Raise `ValueError` naming the key when `env` (variables given to agents) or `passthrough`
    (names of the node's variables passed on) holds a name that is not a POSIX variable name, one
    gyre sets (`AGENT_ENV_OWNED`, `GYRE_*`: the proxy's address and key, the execution's
    folders, the node's secrets), a name in both, or a value with a NUL byte."""
    for key, names in (("env", tuple(env)), ("env_passthrough", passthrough)):
        for name in names:
            if not _ENV_NAME.fullmatch(name):
                raise ValueError(f"{key}: {name!r} is not an environment variable name")
            if name in AGENT_ENV_OWNED or name.startswith("GYRE_"):
                raise ValueError(
                    f"{key}: {name!r} is set by gyre for each execution and cannot be "
                    f"overridden (gyre sets {', '.join(sorted(AGENT_ENV_OWNED))} and GYRE_*)"
                )
    both = sorted(set(env) & set(passthrough))
    if both or len(set(passthrough)) != len(passthrough):
        raise ValueError(
            f"env_passthrough={list(passthrough)} names a variable twice or one `env` sets"
        )
    for name, value in env.items():
        if "\0" in value:
            raise ValueError(f"env: the value of {name!r} holds a NUL byte")


class HarnessConfig(Config, frozen=True):
    """Agent processes of executions (`gyre.agents.harness`): command, limits, workspaces, the
    agents' environment, their isolation (required unless `require_isolation = false`)."""

    agent_command: tuple[str, ...] = ()
    """Command line of the agent; empty: the reference agent (`python -m gyre.agents.react`)."""
    env: dict[str, str] = {}
    """Variables given to every agent process, values as written (`[tasks.harness.env]`), e.g. a
    provider setting or `MSWEA_MODEL_NAME`. They replace gyre's defaults for known agents and
    the node's PATH, LANG, LC_ALL and TZ, but may not name what gyre sets for each execution
    (`AGENT_ENV_OWNED`, `GYRE_*`: a `ValueError` naming it; `gyre.agents.environment`)."""
    env_passthrough: tuple[str, ...] = ()
    """Names of the node's environment variables passed to agents as the node has them (one the
    node lacks is left out, with a warning); the names `env` may not set are refused here too.
    Beyond these and PATH, LANG, LC_ALL, TZ, agents see nothing of the node's environment."""
    workspace_root: str = ""
    """Folder of the per-execution private folders; empty: `<run_dir>/executions`."""
    kill_grace_s: float = 1.0
    """Seconds between SIGTERM and SIGKILL of an agent's process tree at its deadline."""
    cpu_time_s: float = 3600.0
    """RLIMIT_CPU of each agent process, CPU seconds; 0: no limit."""
    memory_bytes: int = 4 * 2**30
    """RLIMIT_AS of each agent and verifier process, bytes; 0: no limit."""
    max_processes: int = 256
    """Extra tasks an agent may create (RLIMIT_NPROC over the uid's current count); 0: no limit."""
    file_size_bytes: int = 256 * 2**20
    """RLIMIT_FSIZE of agent and verifier processes, bytes; 0: no limit."""
    keep_workspaces: bool = False
    """Keep each execution's folder after scoring (debugging)."""
    isolate_uid: bool = True
    """When the node runs as root: each agent runs as its own unprivileged uid and cannot read
    other workspaces or hidden tests (`gyre.agents.isolation`); otherwise `require_isolation`
    refuses the run (a warning when it is false)."""
    agent_uid_base: int = 200_000
    """First uid (and gid) of agents under `isolate_uid`; must be >= 1000 and no real user's."""
    agent_uid_count: int = 4096
    """Agent uids from `agent_uid_base` on: the most isolated executions running at once on a
    node."""
    isolate_mounts: bool = True
    """With `isolate_uid`: each agent and verifier starts in a private mount namespace where every
    top-level folder but the system's (/usr, /etc, /var, ...), `hidden_paths`, the run folder,
    other workspaces and the suites' hidden tests are covered, and /tmp is private
    (`gyre.agents.isolation`; needs CAP_SYS_ADMIN; otherwise refused or a warning, as for
    `isolate_uid`)."""
    require_isolation: bool = True
    """Refuse to run (one `ConfigError` before anything starts) where `isolate_uid`,
    `isolate_mounts` and `isolate_network` cannot all be had (not root, root that cannot switch
    to the agent uids: a user namespace that does not map them, no CAP_SETUID; no CAP_SYS_ADMIN; a
    workspace root or an `agent_command` executable other users cannot reach, which would run
    agents as root): a policy that reads hidden tests or reaches the
    node's ports would be rewarded for it. Without root, user namespaces give agents no uid or
    mount namespace of their own, so a node that is not root refuses. `false` runs agents
    without what is missing: a warning says what, and they see the node's files and ports.
    With `[gateway] enabled` it must be `false` (agent loops run outside gyre's sandbox)."""
    isolate_network: bool = True
    """Each agent runs in a network namespace of its own where only the proxy answers, at the
    address of its `OPENAI_BASE_URL` (relayed from the node's namespace): the node's cells, gloo
    TCPStore, other ports and unix sockets, and the outside world, are out of reach
    (`gyre.agents.isolation`; needs root with CAP_SYS_ADMIN, or unprivileged user namespaces,
    which keep the node's unix sockets at a path in reach; otherwise refused or a warning, as
    for `isolate_uid`)."""
    hidden_paths: tuple[str, ...] = ("/root",)
    """Absolute folders agents and verifiers never see (the interpreter's installation and the
    gyre package are bound back even when they live under one)."""
    visible_paths: tuple[str, ...] = ()
    """Absolute folders or files agents and verifiers see read-only although they lie under a
    covered top-level folder (tools under /opt, a data set under /home). The interpreter's
    installation, the gyre package and the files the agent command names are shown anyway. Not
    `/`, not one of `hidden_paths`, and nothing in the run folder or the workspace root (other
    executions, the call log: refused, `gyre.agents.isolation.check_visible_paths`)."""

    def __post_init__(self) -> None:
        if self.kill_grace_s < 0:
            raise ValueError(f"kill_grace_s={self.kill_grace_s} must be >= 0")
        check_agent_env(self.env, self.env_passthrough)
        off = [
            k for k in ("isolate_uid", "isolate_mounts", "isolate_network") if not getattr(self, k)
        ]
        if self.require_isolation and off:
            raise ValueError(
                f"{off[0]}=false needs require_isolation=false too: require_isolation (true by "
                "default) refuses agents without isolate_uid, isolate_mounts and isolate_network; "
                "set require_isolation = false to run agents unisolated"
            )
        for key in ("hidden_paths", "visible_paths"):
            for path in getattr(self, key):
                if not path.startswith("/"):
                    raise ValueError(f"{key}: {path!r} must be absolute")
                if not path.strip("/"):
                    raise ValueError(f"{key}: {path!r} is the whole filesystem: name a folder")
        both = {p.rstrip("/") for p in self.hidden_paths} & {
            p.rstrip("/") for p in self.visible_paths
        }
        if both:
            raise ValueError(
                f"visible_paths and hidden_paths both name {sorted(both)[0]!r}: leave it out of "
                "hidden_paths to show it (its default is ('/root',))"
            )
        base, count = self.agent_uid_base, self.agent_uid_count
        if base < 1000 or count < 1 or base + count > 2**31:
            raise ValueError(
                f"agent_uid_base={self.agent_uid_base}, "
                f"agent_uid_count={self.agent_uid_count}: need "
                "base >= 1000, count >= 1 and base + count <= 2**31"
            )
        for name in ("cpu_time_s", "memory_bytes", "max_processes", "file_size_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 0 (0: no limit)")


class TaskConfig(Config, frozen=True):
    """Which task suites a run samples from, and how executions run (`gyre.tasks`,
    `gyre.agents`)."""

    suites: tuple[str, ...] = ("examples/tasks/learnable",)
    """Suite folders (see `python -m gyre.tasks generate`)."""
    harness: HarnessConfig = HarnessConfig()

    def __post_init__(self) -> None:
        if not self.suites:
            raise ValueError(f"suites={self.suites!r} must name at least one suite folder")
