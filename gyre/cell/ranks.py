"""A cell's trainer ranks: a cell of k devices is k processes, one DeepSpeed rank each.

Owns `CellTrainer` (in the cell process, rank 0: the trainer `CellRoles` drives; every call runs
on all k ranks), `start_cell_trainer` (rank 0's start-up: the worker ranks, the cell's DeepSpeed
group, its run-wide gradient-group ranks), `spawn_ranks` and `main` (ranks 1 .. k-1:
`python -m gyre.cell.ranks`, driven by rank 0). Rank 0 broadcasts each command (its name
and arguments, pickled) over a gloo group of the cell's ranks, every rank runs it on its own
`DeepSpeedTrainer`, and the outcomes are gathered back, so an error on any rank is rank 0's
error and the ranks stay in step. `accumulate` deals the micro-batches round robin, with zero
passes for the ranks that get fewer (`gyre.engines.zero3`). The gradient exchange runs on the
run-wide group, rank r of a satellite to rank r of the core (`GradientGroup.send_shard`). With
k = 1 there are no workers and no broadcast. Each rank sees only its cell's devices
(`CUDA_VISIBLE_DEVICES`, set per cell by `open_cells`) and trains on `cuda:<rank>`. Knows nothing
about HTTP, roles or the engine; blocking: call from a worker thread.
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from gyre.config import RLConfig, TrainerConfig
from gyre.errors import EngineError, InvalidRequestError

__all__ = ["CellTrainer", "start_cell_trainer", "spawn_ranks", "main"]

logger = logging.getLogger(__name__)

_IDLE = datetime.timedelta(days=365)
"""Timeout of the cell's command group: a worker rank waits for rank 0's next command for as
long as the cell lives (a cell in rollout sends none for hours). A rank that dies fails the next
command at once (the peer's connection closes); a hung one is bounded by the node's
`train_timeout_s` on the call."""

_COMMANDS = frozenset(
    {
        "accumulate",
        "apply_step",
        "zero_grad",
        "load_weights",
        "save_snapshot",
        "save_checkpoint",
        "load_checkpoint",
        "send_gradients",
        "receive_gradients",
        "stop",
    }
)


class _Rank:
    """What every rank runs for a command: its trainer and its gradient-group membership."""

    def __init__(self, trainer, group, rank: int, ranks: int) -> None:
        self.trainer = trainer
        self.group = group
        self.rank = rank
        self.ranks = ranks

    def accumulate(self, micro_batches, advantages):
        mine = list(micro_batches[self.rank :: self.ranks])
        passes = -(-len(micro_batches) // self.ranks)
        if self.ranks == 1:
            return self.trainer.accumulate(mine, advantages)
        return self.trainer.accumulate(mine, advantages, passes=passes)

    def apply_step(self):
        return self.trainer.apply_step()

    def zero_grad(self):
        self.trainer.zero_grad()

    def load_weights(self, snapshot, version):
        self.trainer.load_weights(snapshot, version)

    def save_snapshot(self, root):
        return self.trainer.save_snapshot(root)

    def save_checkpoint(self, path):
        self.trainer.save_checkpoint(path)

    def load_checkpoint(self, path):
        self.trainer.load_checkpoint(path)

    def send_gradients(self, dst_cell):
        self.group.send_shard(self.trainer.gradient_shard(), dst_cell)
        self.trainer.zero_grad()  # only once delivered: a failed send keeps the gradients

    def receive_gradients(self, src_cell):
        import torch

        trainer = self.trainer
        shard = torch.empty(trainer.shard_numel, dtype=trainer.grad_dtype, device=trainer.device)
        trainer.add_gradient_shard(self.group.recv_shard(shard, src_cell))


class CellTrainer:
    """Rank 0's trainer of a cell of `ranks` devices: the `DeepSpeedTrainer` interface that
    `CellRoles` uses, each call run on every rank.

    Args:
        trainer: rank 0's `DeepSpeedTrainer` (a ZeRO-3 group of `ranks` ranks when `ranks` > 1).
        group: rank 0's `GradientGroup` (None without a run-wide group).
        ranks: k; with k > 1, `commands` is the cell's gloo group of its ranks.
        workers: the worker processes (ranks 1 .. k-1), stopped by `close`.

    A call raises what rank 0's trainer raised, or `EngineError` naming the rank and its
    exception when only a worker failed.
    """

    def __init__(
        self, trainer, group=None, *, ranks: int = 1, commands=None, workers: Sequence = ()
    ) -> None:
        if ranks > 1 and commands is None:
            raise ValueError(f"a cell of ranks={ranks} needs its command group")
        self.trainer = trainer
        self.ranks = ranks
        self._rank = _Rank(trainer, group, 0, ranks)
        self._commands = commands
        self._workers = list(workers)

    # -- what CellRoles and the cell API read ----------------------------------------------------

    @property
    def version(self) -> int:
        return self.trainer.version

    @property
    def has_gradients(self) -> bool:
        return self.trainer.has_gradients

    def statistics(self):
        return self.trainer.statistics()

    # -- commands --------------------------------------------------------------------------------

    def _run(self, name: str, *args):
        """Run command `name` on every rank; rank 0's result (`accumulate`: every rank's, in
        rank order)."""
        assert name in _COMMANDS
        if self.ranks == 1:
            result = getattr(self._rank, name)(*args)
            return [result] if name == "accumulate" else result
        import torch.distributed as dist

        dist.broadcast_object_list([(name, args)], src=0, group=self._commands)
        result, outcome = _outcome(self._rank, 0, name, args)
        outcomes: list[Any] = [None] * self.ranks  # each rank's outcome, by all_gather_object
        dist.all_gather_object(outcomes, outcome, group=self._commands)
        if isinstance(result, BaseException):
            raise result
        failed = [e for e, _ in outcomes if e is not None]
        if failed:
            rank, kind, message = failed[0]
            raise EngineError(f"trainer rank {rank} of the cell failed {name}: {kind}: {message}")
        if name == "accumulate":
            return [result] + [_stats(payload) for _, payload in outcomes[1:]]
        return result

    def accumulate(self, micro_batches: Sequence, advantages: Mapping[str, float | None]):
        """Accumulate the micro-batches' gradients, dealt round robin over the ranks (rank r takes
        micro-batches r, r + k, ...); returns the `AccumulateStatistics` summed over the ranks.
        Raises `ValueError` (before any rank runs anything) for no micro-batches or an execution
        without an advantage."""
        if not micro_batches:
            raise ValueError("accumulate needs at least one micro-batch")
        for batch in micro_batches:
            missing = [e for e in batch.execution_ids if e not in advantages]
            if missing:
                raise ValueError(f"executions {missing} have no advantage (pass None for no loss)")
        from gyre.engines.protocol import AccumulateStatistics

        stats = self._run("accumulate", list(micro_batches), dict(advantages))
        if len(stats) == 1:
            return stats[0]
        summed = {
            f: sum(getattr(s, f) for s in stats)
            for f in AccumulateStatistics.__struct_fields__
            if f != "finite"
        }
        return AccumulateStatistics(**summed, finite=all(s.finite for s in stats))

    def apply_step(self):
        return self._run("apply_step")

    def zero_grad(self) -> None:
        self._run("zero_grad")

    def load_weights(self, snapshot: str | Path, version: int) -> None:
        self._run("load_weights", str(snapshot), version)

    def save_snapshot(self, root: str | Path) -> Path:
        return self._run("save_snapshot", str(root))

    def save_checkpoint(self, path: str | Path) -> None:
        self._run("save_checkpoint", str(path))

    def load_checkpoint(self, path: str | Path) -> None:
        self._run("load_checkpoint", str(path))

    def send_gradients(self, dst_cell: int) -> None:
        """Satellite: every rank sends its gradient shard to the matching rank of cell
        `dst_cell`, then zeroes it. Raises `InvalidRequestError` without a gradient group."""
        self._need_group()
        self._run("send_gradients", dst_cell)

    def receive_gradients(self, src_cell: int) -> None:
        """Core: every rank receives the matching rank of cell `src_cell`'s shard and adds it."""
        self._need_group()
        self._run("receive_gradients", src_cell)

    def _need_group(self) -> None:
        if self._rank.group is None:
            raise InvalidRequestError(
                "this cell has no gradient group "
                "(start it with --rank, --world-size and --group-store)"
            )

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop the worker ranks (a `stop` command, then their exit, killed after
        `timeout_s`)."""
        if self.ranks > 1 and all(w.poll() is None for w in self._workers):
            try:
                self._run("stop")
            except (RuntimeError, EngineError):
                pass  # a worker is gone already: the rest are killed below
        for worker in self._workers:
            try:
                worker.wait(timeout_s)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()


def _outcome(rank: _Rank, index: int, name: str, args) -> tuple[Any, tuple]:
    """Run one command on this rank: (its result or exception, what rank 0 gathers: the error as
    (rank, exception type, message) or None, and the `accumulate` statistics as builtins; plain
    values only, as a worker's classes live in its `__main__`)."""
    if name == "stop":
        return None, (None, None)
    try:
        result = getattr(rank, name)(*args)
    except Exception as exc:  # gathered to rank 0, which raises it; this rank keeps serving
        return exc, ((index, type(exc).__name__, str(exc)[:500]), None)
    return result, (None, msgspec.to_builtins(result) if name == "accumulate" else None)


def _stats(payload):
    from gyre.engines.protocol import AccumulateStatistics

    return msgspec.convert(payload, AccumulateStatistics)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_ranks(
    model: str,
    trainer: TrainerConfig,
    rl: RLConfig,
    *,
    ranks: int,
    init_method: str,
    group: tuple[str, int, int] | None = None,
) -> list[subprocess.Popen]:
    """Start worker ranks 1 .. `ranks` - 1 of this cell (`python -m gyre.cell.ranks`;
    output to this process's, they die with it). `group` = (store address, this cell's index,
    the number of cells) puts rank r at run-wide rank index * k + r."""
    from gyre.cell.spawn import _die_with_parent

    workers = []
    for rank in range(1, ranks):
        cmd = [
            sys.executable,
            "-m",
            "gyre.cell.ranks",
            "--model",
            model,
            "--trainer-config",
            msgspec.json.encode(trainer).decode(),
            "--rl-config",
            msgspec.json.encode(rl).decode(),
            "--rank",
            str(rank),
            "--ranks",
            str(ranks),
            "--init-method",
            init_method,
        ]
        if group is not None:
            address, cell, cells = group
            cmd += ["--group-store", address, "--cell", str(cell), "--cells", str(cells)]
        env = {**os.environ, "LOCAL_RANK": str(rank)}
        workers.append(
            subprocess.Popen(cmd, stdin=subprocess.DEVNULL, env=env, preexec_fn=_die_with_parent)
        )
    return workers


def _start_rank(
    model: str,
    trainer_config: TrainerConfig,
    rl: RLConfig,
    *,
    rank: int,
    ranks: int,
    init_method: str | None,
    group: tuple[str, int, int] | None,
):
    """One rank's start-up, the same on every rank: its DeepSpeed group, trainer, command group
    and gradient-group membership. Returns (trainer, commands, gradient group)."""
    import torch.distributed as dist

    from gyre.engines.trainer import DeepSpeedTrainer, init_process_group
    from gyre.rl import PolicyObjective

    if ranks > 1 and trainer_config.zero_stage != 3:
        raise ValueError(
            f"a cell of devices_per_cell={ranks} needs trainer.zero_stage=3 "
            f"(got {trainer_config.zero_stage}): its trainer shards over the cell's ranks"
        )
    init_process_group(rank=rank, world_size=ranks, init_method=init_method)
    trainer = DeepSpeedTrainer(model, trainer_config, PolicyObjective(rl))
    commands = dist.new_group(backend="gloo", timeout=_IDLE) if ranks > 1 else None
    gradient_group = None
    if group is not None:
        from gyre.cell.grad_group import GradientGroup

        address, cell, cells = group
        gradient_group = GradientGroup(
            address,
            cell * ranks + rank,
            cells * ranks,
            timeout_s=trainer_config.train_timeout_s,
            ranks_per_cell=ranks,
        )
    return trainer, commands, gradient_group


def start_cell_trainer(
    model: str,
    trainer_config: TrainerConfig,
    rl: RLConfig,
    *,
    ranks: int = 1,
    group: tuple[str, int, int] | None = None,
) -> tuple[CellTrainer, Any]:
    """Rank 0's start-up of a cell's trainer: spawn ranks 1 .. k-1, form the cell's DeepSpeed
    group of k ranks (a free loopback port: the cell's ranks share its host) and, with `group` =
    (store address, cell index, number of cells), the run-wide group. Returns the `CellTrainer`
    and rank 0's `GradientGroup` (None without `group`). Raises `ValueError` for k > 1 below
    ZeRO-3; a worker that fails to start makes this raise (or time out) as the group does."""
    init_method: str | None = None
    workers: list[subprocess.Popen] = []
    if ranks > 1:
        init_method = f"tcp://127.0.0.1:{_free_port()}"
        workers = spawn_ranks(
            model, trainer_config, rl, ranks=ranks, init_method=init_method, group=group
        )
    try:
        trainer, commands, gradient_group = _start_rank(
            model, trainer_config, rl, rank=0, ranks=ranks, init_method=init_method, group=group
        )
    except BaseException:
        for worker in workers:
            worker.kill()
        raise
    cell_trainer = CellTrainer(
        trainer, gradient_group, ranks=ranks, commands=commands, workers=workers
    )
    return cell_trainer, gradient_group


def serve_rank(rank: _Rank, commands) -> None:
    """A worker rank's loop: run rank 0's commands until `stop`."""
    import torch.distributed as dist

    while True:
        box: list[Any] = [None]  # rank 0's (name, args), by broadcast_object_list
        dist.broadcast_object_list(box, src=0, group=commands)
        name, args = box[0]
        _, outcome = _outcome(rank, rank.rank, name, args)
        dist.all_gather_object([None] * rank.ranks, outcome, group=commands)
        if name == "stop":
            return


def main(argv: list[str] | None = None) -> int:
    """`python -m gyre.cell.ranks`: one worker rank (1 .. k-1) of a cell; it joins the
    cell's groups, then runs rank 0's commands until told to stop. Returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m gyre.cell.ranks")
    parser.add_argument("--model", required=True)
    parser.add_argument("--trainer-config", required=True, help="TrainerConfig as JSON")
    parser.add_argument("--rl-config", required=True, help="RLConfig as JSON")
    parser.add_argument("--rank", type=int, required=True, help="this rank in the cell (>= 1)")
    parser.add_argument("--ranks", type=int, required=True, help="the cell's ranks (k)")
    parser.add_argument("--init-method", required=True, help="tcp://HOST:PORT of rank 0")
    parser.add_argument("--group-store", default=None, help="HOST:PORT of the run-wide store")
    parser.add_argument("--cell", type=int, default=None, help="this cell's index in the run")
    parser.add_argument("--cells", type=int, default=None, help="cells in the run")
    args = parser.parse_args(argv)
    if not 1 <= args.rank < args.ranks:
        parser.error(f"--rank {args.rank} must be in [1, --ranks {args.ranks})")
    group_args = (args.group_store, args.cell, args.cells)
    if any(a is not None for a in group_args) and any(a is None for a in group_args):
        parser.error("--group-store, --cell and --cells go together")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    trainer_config = msgspec.json.decode(args.trainer_config.encode(), type=TrainerConfig)
    rl = msgspec.json.decode(args.rl_config.encode(), type=RLConfig)
    group = None if args.group_store is None else group_args
    trainer, commands, gradient_group = _start_rank(
        args.model,
        trainer_config,
        rl,
        rank=args.rank,
        ranks=args.ranks,
        init_method=args.init_method,
        group=group,
    )
    logger.info("cell trainer rank %d of %d ready", args.rank, args.ranks)
    serve_rank(_Rank(trainer, gradient_group, args.rank, args.ranks), commands)
    return 0


if __name__ == "__main__":
    sys.exit(main())
