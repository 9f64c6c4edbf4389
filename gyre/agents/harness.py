"""The harness: one execution = one agent process in its own workspace, stopped from outside.

Owns `Harness`, `HarnessStatistics`, `check_agent_command` and `REACT_AGENT`. `Harness.run(task,
execution_id)` copies the task's `environment/` into a private per-execution folder (hidden tests
and solution are never copied), starts the agent command under the supervisor (resource limits,
new session; `gyre.sandbox`) with the proxy's address, a minted key and the model name
(`gyre.agents.environment`: OpenAI and Anthropic variables, `[tasks.harness] env`) and the
instruction, stops it at the deadline or when its `ExecutionControl` (`gyre.agents.control`) says
so (turns, tokens, context), kills its whole tree, runs the verifier on what the workspace holds,
and returns one `Outcome` (`gyre.agents.ending`: the termination and the failure rules). Each
concern of an execution is one step with its own cleanup (`_run_as`). Never raises for an
execution's failure: infrastructure problems become `termination="failed"` with a reason
(docs/design.md invariant 5). Agents run as their own uids in a default-deny mount namespace and
a sealed network namespace whose one way out is the proxy, where the node allows it
(`gyre.agents.isolation` says how). Knows nothing about HTTP, tokens or the proxy but its URL:
whoever watches the model calls feeds `ExecutionControl`.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import anyio
import msgspec

from gyre._counters import Counters
from gyre.agents.agent_users import AgentUser, hand_back, hand_over, held_folder
from gyre.agents.control import ExecutionControl, check_execution_id, mint_api_key
from gyre.agents.ending import AgentRun, failed_outcome, nothing_to_train_on
from gyre.agents.environment import agent_environment
from gyre.agents.isolation import (
    agent_namespace,
    closed_to_others,
    isolation_refused,
    node_sockets,
    reach_refused,
    sealed_endpoint,
    shown_paths,
    suite_hidden,
    tighten_hidden,
    unreachable_executable,
    unreachable_refused,
    warn_once,
    workspace_problem,
)
from gyre.config import HarnessConfig
from gyre.config.agents import check_agent_env
from gyre.errors import ConfigError, ExecutionError
from gyre.sandbox import (
    Limits,
    Mounts,
    ProcessResult,
    Relay,
    network_namespace_problem,
    run_supervised,
    tail,
)
from gyre.tasks.outcome import Outcome
from gyre.tasks.scorer import VerifierError, score_workspace
from gyre.tasks.task import Task

__all__ = ["Harness", "HarnessStatistics", "check_agent_command", "REACT_AGENT"]

REACT_AGENT: tuple[str, ...] = (sys.executable, "-P", "-m", "gyre.agents.react")
"""The reference agent's command line (`-P`: files in the workspace cannot shadow its imports)."""

logger = logging.getLogger(__name__)


def check_agent_command(command: Sequence[str], path: str | None = None) -> None:
    """Raise `ConfigError` (naming `tasks.harness.agent_command`) when the agent's program cannot
    start on this node: a bare name not found on `path` (default: this process's PATH, which agents
    inherit), or an absolute path that is not an executable file. A relative path with a slash is
    resolved in each execution's workspace and is not checked here. An empty command is the
    reference agent."""
    if not command:
        return
    program = command[0]
    if "/" in program and not os.path.isabs(program):
        return
    path = os.environ.get("PATH", os.defpath) if path is None else path
    if shutil.which(program, path=path) is None:
        where = "is not an executable file" if os.path.isabs(program) else "is not found on PATH"
        raise ConfigError(f"tasks.harness.agent_command[0]={program!r} {where}")


def _private(path: str, flags: int) -> int:
    """`open` opener: a new file only its owner can read and write."""
    return os.open(path, flags, 0o600)


class HarnessStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """Counters of one harness since it was built (docs/style.md rule 6)."""

    running: int
    """Executions whose agent or verifier runs now."""
    finished: int
    stopped: int
    """Ended at a limit (timeout, turns, tokens, context) and partially scored."""
    failed: int
    isolated: int = 0
    """Executions whose agent ran as its own uid (the rest ran as the node's user)."""
    sealed: int = 0
    """Executions whose agent ran in a network namespace of its own that reaches only the proxy."""


class Harness:
    """Runs executions: agent process, deadline, kill, verifier, `Outcome`.

    `base_url` is the OpenAI-compatible endpoint agents talk to (the TITO proxy, `.../v1`).
    `workspace_root` holds one private folder per execution (a fresh temporary folder if None).
    """

    def __init__(
        self,
        *,
        base_url: str,
        agent_command: Sequence[str] = REACT_AGENT,
        model: str = "gyre",
        workspace_root: str | os.PathLike[str] | None = None,
        limits: Limits = Limits(
            cpu_time_s=3600, memory_bytes=4 * 2**30, max_processes=256, file_size_bytes=256 * 2**20
        ),
        verifier_limits: Limits = Limits(
            memory_bytes=4 * 2**30, max_processes=256, file_size_bytes=256 * 2**20
        ),
        kill_grace_s: float = 1.0,
        keep_workspaces: bool = False,
        env: dict[str, str] | None = None,
        env_passthrough: Sequence[str] = (),
        isolate_uid: bool = True,
        agent_uid_base: int = 200_000,
        agent_uid_count: int = 4096,
        isolate_mounts: bool = True,
        hidden_paths: Sequence[str | os.PathLike[str]] = ("/root",),
        visible_paths: Sequence[str | os.PathLike[str]] = (),
        run_dir: str | os.PathLike[str] | None = None,
        require_isolation: bool = True,
        isolate_network: bool = True,
    ) -> None:
        """`isolate_uid`: run each agent as its own uid from `agent_uid_base` on (`agent_uid_count`
        of them) when we are root (see the module docstring); otherwise a warning, once.
        `isolate_mounts`: with `isolate_uid`, also give each agent and verifier a private mount
        namespace (module docstring) hiding the non-system top-level folders, `hidden_paths`,
        `run_dir` (call log, checkpoints, snapshots) and the workspace root but their own folder,
        and showing `visible_paths` read-only; a warning, once, where it cannot be built.
        `isolate_network`: run each agent in a network namespace of its own where only
        `base_url`'s port answers, relayed to the proxy (module docstring of
        `gyre.agents.isolation`); a warning, once, where it cannot be built (neither root nor
        unprivileged user namespaces).
        `require_isolation` (true by default, as in `HarnessConfig`): where any of the three is
        off or cannot be had, or `agent_command`'s executable or the verifiers' interpreter cannot
        be reached by agent uids (`reach_refused`), raise `ConfigError` (`isolation_refused`), and
        an execution whose own command cannot be reached is `failed`, nothing run; false: the
        warnings, and such agents run as root.
        `env`, `env_passthrough`: `HarnessConfig`'s (`agent_environment`).
        Raises `ValueError` for an empty command, a negative grace, an invalid uid range, a
        relative hidden or visible path, a visible path in `run_dir` or the workspace root
        (`check_visible_paths`' `ConfigError`), an `env` name gyre sets (`check_agent_env`) or,
        when sealing, a `base_url` that is not http(s)."""
        if not agent_command:
            raise ValueError("agent_command must not be empty")
        self.env, self.env_passthrough = dict(env or {}), tuple(env_passthrough)
        check_agent_env(self.env, self.env_passthrough)
        for name in self.env_passthrough:
            if name not in os.environ:
                warn_once(f"env:{name}", "env_passthrough: %s is not set on the node", name)
        if kill_grace_s < 0:
            raise ValueError(f"kill_grace_s={kill_grace_s} must be >= 0")
        if agent_uid_base < 1000 or agent_uid_count < 1 or agent_uid_base + agent_uid_count > 2**31:
            raise ValueError(
                f"agent_uid_base={agent_uid_base}, agent_uid_count={agent_uid_count}: need "
                "base >= 1000, count >= 1 and base + count <= 2**31"
            )
        self.base_url = base_url
        self.agent_command = tuple(agent_command)
        self.model = model
        root = (
            Path(workspace_root)
            if workspace_root is not None
            else Path(tempfile.mkdtemp(prefix="gyre-ws-"))
        )
        root.mkdir(parents=True, exist_ok=True)
        self.agent_uid_base, self.agent_uid_count = agent_uid_base, agent_uid_count
        for key, paths in (("hidden_paths", hidden_paths), ("visible_paths", visible_paths)):
            for path in paths:
                if not os.path.isabs(path):
                    raise ValueError(f"{key}: {str(path)!r} must be absolute")
        self.mounts: Mounts | None = None
        self._hidden: set[str] = set()  # hidden on purpose: what a command names there stays hidden
        """The namespace every agent starts from (None: no mount isolation); per execution its
        own folder is added, and the hidden files of the task's suite."""
        mount_problem = None
        if isolate_uid and isolate_mounts and os.geteuid() == 0:
            self.mounts, self._hidden, mount_problem = agent_namespace(
                root,
                hidden_paths=hidden_paths,
                visible_paths=visible_paths,
                run_dir=None if run_dir is None else Path(run_dir),
            )
        self._suite_hidden: set[str] = set()
        self._suites_seen: set[Path] = set()
        agent_uids = range(agent_uid_base, agent_uid_base + agent_uid_count)
        uid_problem = workspace_problem(root, self.mounts, agent_uids) if isolate_uid else None
        net_problem = network_namespace_problem() if isolate_network else None
        if net_problem is not None:
            net_problem = (
                f"isolate_network: no network namespace for agents ({net_problem}): "
                "they reach every port of the node"
            )
        if require_isolation:
            switches = dict(
                isolate_uid=isolate_uid,
                isolate_mounts=isolate_mounts,
                isolate_network=isolate_network,
            )
            off = [f"{key} is false" for key, on in switches.items() if not on]
            problem = uid_problem or mount_problem or net_problem or next(iter(off), None)
            problem = problem or reach_refused(
                self.agent_command,
                path=self.env.get("PATH", os.environ.get("PATH", os.defpath)),
                mounts=self.mounts,
                hidden=self._hidden,
                key="tasks.harness.agent_command",
            )
            if problem is not None:
                raise isolation_refused(problem)
        self.require_isolation = require_isolation
        if mount_problem is not None:
            warn_once("mounts", "%s", mount_problem)
        if net_problem is not None:
            warn_once("network", "%s", net_problem)
        self.sealed = isolate_network and net_problem is None
        """Agents run in a network namespace of their own whose one way out is `relay`."""
        self.relay: Relay | None = None
        self.agent_base_url = base_url
        if self.sealed:
            self.relay, self.agent_base_url = sealed_endpoint(base_url)
        """How an agent's namespace reaches the proxy (None: not sealed), and the
        `OPENAI_BASE_URL` it is given."""
        if uid_problem is not None:
            warn_once(f"uid:{root}", "%s", uid_problem)
        self.isolated = isolate_uid and uid_problem is None
        """Agents run as their own uids (`isolate_uid`, we are root, the root is reachable)."""
        os.chmod(root, 0o711 if self.isolated else 0o700)  # 0711: agents pass, nobody lists
        self.workspace_root = root
        self.limits = limits
        self.verifier_limits = verifier_limits
        self.kill_grace_s = kill_grace_s
        self.keep_workspaces = keep_workspaces
        self._counts = Counters("running", "finished", "stopped", "failed", "isolated", "sealed")
        self._template_ok: dict[str, bool] = {}  # task root -> its verifier works on the template
        self._hidden_tightened: set[str] = set()  # task roots whose tests/ and solution/ are 0700

    def hide_suite(self, suite: str | os.PathLike[str]) -> None:
        """Hide `tests/` and `solution/` of every task in the folder `suite` from agents and
        verifiers started from now on (a task's own suite is hidden when it first runs; the job
        hides every configured suite before the first execution). No effect without mount
        isolation. Raises `OSError` if `suite` cannot be listed."""
        folder = Path(suite)
        if self.mounts is not None and folder not in self._suites_seen:
            self._suite_hidden |= suite_hidden(folder)
            self._suites_seen.add(folder)

    @classmethod
    def from_config(
        cls,
        config: HarnessConfig,
        *,
        base_url: str,
        model: str = "gyre",
        run_dir: str | os.PathLike[str] = ".",
    ) -> Harness:
        """A harness as `config` describes it (`RunConfig.tasks.harness`); workspaces default to
        `<run_dir>/executions`."""
        common = dict(
            memory_bytes=config.memory_bytes,
            file_size_bytes=config.file_size_bytes,
            max_processes=config.max_processes,
        )
        return cls(
            base_url=base_url,
            agent_command=config.agent_command or REACT_AGENT,
            model=model,
            workspace_root=config.workspace_root or Path(run_dir) / "executions",
            limits=Limits(cpu_time_s=config.cpu_time_s, **common),
            verifier_limits=Limits(**common),
            kill_grace_s=config.kill_grace_s,
            keep_workspaces=config.keep_workspaces,
            env=config.env,
            env_passthrough=config.env_passthrough,
            isolate_uid=config.isolate_uid,
            agent_uid_base=config.agent_uid_base,
            agent_uid_count=config.agent_uid_count,
            isolate_mounts=config.isolate_mounts,
            hidden_paths=config.hidden_paths,
            visible_paths=config.visible_paths,
            run_dir=Path(run_dir).absolute(),
            require_isolation=config.require_isolation,
            isolate_network=config.isolate_network,
        )

    def statistics(self) -> HarnessStatistics:
        """Counters since this harness was built."""
        return HarnessStatistics(**self._counts)

    def execution_dir(self, execution_id: str) -> Path:
        """The private folder of an execution: `workspace/`, `instruction.md`, logs."""
        return self.workspace_root / execution_id

    def _prepare(self, task: Task, execution_id: str, user: AgentUser | None) -> Path:
        exec_dir = self.execution_dir(execution_id)
        exec_dir.mkdir(mode=0o700)  # FileExistsError: an execution ID is used once
        shutil.copytree(task.environment_dir, exec_dir / "workspace", symlinks=True)
        (exec_dir / "home").mkdir()
        (exec_dir / "tmp").mkdir()
        (exec_dir / "instruction.md").write_text(task.instruction, encoding="utf-8")
        if user is not None:
            self.hide_suite(task.path.parent)
            if task.root not in self._hidden_tightened:
                tighten_hidden(task)
                self._hidden_tightened.add(task.root)
            hand_over(exec_dir, user.uid)
        return exec_dir

    async def run(
        self,
        task: Task,
        execution_id: str,
        *,
        control: ExecutionControl | None = None,
        api_key: str | None = None,
        agent_command: Sequence[str] | None = None,
    ) -> Outcome:
        """Run one execution of `task` and return its `Outcome` (never raises for its failure).

        `control` carries the model-call counters the proxy reports (one is made from the task's
        limits if None); `api_key` defaults to `mint_api_key(execution_id)` (pass the proxy's
        key). The agent runs at most `task.spec.agent.deadline_s` seconds. An execution with no
        model call, or whose calls sampled no token at all, is `failed`: it has nothing to train
        on (field case B20). Raises `ValueError` for a bad `execution_id` and `FileExistsError`
        if it was used before with this harness.
        """
        check_execution_id(execution_id)
        limits_spec = task.spec.agent
        if control is None:
            control = ExecutionControl(
                max_turns=limits_spec.max_turns, token_budget=limits_spec.token_budget
            )
        api_key = api_key or mint_api_key(execution_id)
        command = tuple(agent_command or self.agent_command)
        self._counts["running"] += 1
        try:
            outcome = await self._run(task, execution_id, control, api_key, command)
        finally:
            self._counts["running"] -= 1
        self._counts[
            "failed" if outcome.failed else "stopped" if outcome.stopped else "finished"
        ] += 1
        return outcome

    async def _run(
        self,
        task: Task,
        execution_id: str,
        control: ExecutionControl,
        api_key: str,
        command: tuple[str, ...],
    ) -> Outcome:
        """Pick the agent's uid (held until the execution is scored), then `_run_as` it."""
        env = agent_environment(
            base_url=self.agent_base_url,
            api_key=api_key,
            model=self.model,
            env=self.env,
            passthrough=self.env_passthrough,
        )
        user: AgentUser | None = None
        path, hidden = env.get("PATH", os.defpath), self._hidden | self._suite_hidden
        closed = None
        if self.isolated:  # root only because other users cannot reach it: refused or warned
            closed = unreachable_executable(command, path, self.mounts, hidden)
        if closed is not None and self.require_isolation:
            return failed_outcome(
                task,
                execution_id,
                f"tasks.harness.require_isolation: "
                f"{unreachable_refused(closed, 'the agent command')}; it did not run",
            )
        if closed is not None:
            warn_once(f"exe:{command[0]}", "isolate_uid: agents run as root: %s", closed)
        elif self.isolated:
            try:
                user = await anyio.to_thread.run_sync(
                    AgentUser.acquire, self.agent_uid_base, self.agent_uid_count
                )
            except (OSError, ExecutionError) as exc:
                return failed_outcome(task, execution_id, f"cannot pick an agent uid: {exc}")
        try:
            return await self._run_as(task, execution_id, control, command, env, user)
        finally:
            if user is not None:
                user.release()

    async def _run_as(
        self,
        task: Task,
        execution_id: str,
        control: ExecutionControl,
        command: tuple[str, ...],
        env: dict[str, str],
        user: AgentUser | None,
    ) -> Outcome:
        """Set up the execution's folder, run the agent there, apply the failure rules and score
        what it left. The folder is handed back and removed (unless kept) whatever happens."""
        try:
            exec_dir = await self._set_up(task, execution_id, user)
        except FileExistsError:
            raise
        except OSError as exc:
            return failed_outcome(task, execution_id, f"cannot prepare the workspace: {exc}")
        self._counts["isolated"] += user is not None
        self._counts["sealed"] += self.sealed
        workspace = _point_at(env, exec_dir, execution_id)
        agent_mounts, verifier_mounts = self._namespaces(exec_dir, command, env, user)
        verifier_user = _verifier_user(user, verifier_mounts)
        held = held_folder(exec_dir, handed_over=user is not None, keep=self.keep_workspaces)
        async with held as handover:
            try:
                result, tails = await self._supervise(
                    task, exec_dir, command, env, control, user, agent_mounts
                )
                await handover.hand_back()  # the tree is gone: nothing runs as the agent's uid
                ran = AgentRun.ended(task, execution_id, result, tails, control)
                reason = nothing_to_train_on(ran)
                if reason is not None:
                    return ran.outcome(failure_reason=reason)
                return await self._score(task, workspace, ran, verifier_user, verifier_mounts)
            except (OSError, ExecutionError) as exc:
                return failed_outcome(task, execution_id, f"{type(exc).__name__}: {exc}")

    async def _set_up(self, task: Task, execution_id: str, user: AgentUser | None) -> Path:
        """`_prepare` the execution's folder (in a thread). Where that fails with `OSError`, what
        the agent's uid was handed of it is handed back before the error is raised."""
        try:
            return await anyio.to_thread.run_sync(self._prepare, task, execution_id, user)
        except FileExistsError:
            raise
        except OSError:
            exec_dir = self.execution_dir(execution_id)
            if user is not None and exec_dir.is_dir():
                await anyio.to_thread.run_sync(hand_back, exec_dir)
            raise

    def _namespaces(
        self,
        exec_dir: Path,
        command: tuple[str, ...],
        env: dict[str, str],
        user: AgentUser | None,
    ) -> tuple[Mounts | None, Mounts | None]:
        """The agent's and the verifier's mount namespaces (None, None without mount isolation or
        an agent uid): both hide what every agent's hides, the suites' hidden files and, when
        sealed, the node's sockets; the agent's shows what its command names and writes only its
        execution's folder; the verifier's is read-only and has no network."""
        if user is None or self.mounts is None:
            return None, None
        sockets = node_sockets() if self.sealed else set()
        hide = tuple(sorted({*self.mounts.hide, *self._suite_hidden, *sockets}))
        path = env.get("PATH", os.defpath)
        named = shown_paths(command, path, self._hidden | self._suite_hidden)
        expose = (*self.mounts.expose, *named)
        agent_mounts = msgspec.structs.replace(
            self.mounts, hide=hide, expose=expose, writable=(os.path.abspath(exec_dir),)
        )
        verifier_mounts = msgspec.structs.replace(
            self.mounts, hide=hide, read_only=True, network=False
        )
        return agent_mounts, verifier_mounts

    async def _supervise(
        self,
        task: Task,
        exec_dir: Path,
        command: tuple[str, ...],
        env: dict[str, str],
        control: ExecutionControl,
        user: AgentUser | None,
        mounts: Mounts | None,
    ) -> tuple[ProcessResult, tuple[str, str]]:
        """Run the agent under the supervisor in its workspace until it exits, its deadline passes
        or `control` stops it; return how it ended and the tails of its stdout and stderr."""
        # 0600: other agents pass through this folder (0711) but must not read the logs
        with (
            open(exec_dir / "stdout.log", "wb+", opener=_private) as out,
            open(exec_dir / "stderr.log", "wb+", opener=_private) as err,
        ):
            result = await run_supervised(
                command,
                cwd=exec_dir / "workspace",
                env=env,
                limits=self.limits,
                deadline_s=task.spec.agent.deadline_s,
                stdout=out,
                stderr=err,
                kill_grace_s=self.kill_grace_s,
                stop=control.event,
                user=None if user is None else (user.uid, user.uid),
                mounts=mounts,
                relay=self.relay,
            )
            return result, (tail(out), tail(err))

    async def _score(
        self,
        task: Task,
        workspace: Path,
        ran: AgentRun,
        user: tuple[int, int] | None,
        mounts: Mounts | None,
    ) -> Outcome:
        """Run the task's verifier on `workspace` (as `user` in `mounts`, if given) and return
        the scored outcome, or a failed one where the verifier fails."""
        try:
            score = await score_workspace(
                task,
                workspace,
                limits=self.verifier_limits,
                template_ok=self._template_ok,
                user=user,
                mounts=mounts if user else None,
            )
        except VerifierError as exc:
            return ran.outcome(failure_reason=str(exc))
        return ran.outcome(score=score)


def _point_at(env: dict[str, str], exec_dir: Path, execution_id: str) -> Path:
    """Point the agent's environment at its execution's folder; return its workspace."""
    workspace = exec_dir / "workspace"
    env.update(
        HOME=str(exec_dir / "home"),
        TMPDIR=str(exec_dir / "tmp"),
        GYRE_EXECUTION_ID=execution_id,
        GYRE_WORKSPACE=str(workspace),
        GYRE_INSTRUCTION_FILE=str(exec_dir / "instruction.md"),
    )
    return workspace


def _verifier_user(user: AgentUser | None, mounts: Mounts | None) -> tuple[int, int] | None:
    """The uid and gid the verifier runs as: the agent's, once the agent's tree is gone, if its
    Python is reachable in `mounts`; None (root) otherwise, with a warning, once."""
    if user is None:
        return None
    if closed_to_others(Path(sys.executable), executable=True, mounts=mounts) is None:
        return (user.uid, user.uid)
    warn_once(
        "verifier-root",
        "isolate_uid: verifiers run as root: other users cannot reach %s",
        sys.executable,
    )
    return None
