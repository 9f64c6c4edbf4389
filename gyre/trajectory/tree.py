"""The trajectory tree: every model call of one execution merged into one token-level prefix tree.

Owns `TrajectoryTree` (built with `build_tree` from an execution's `ModelCall` records) and its
`TreeStatistics`. A node is one token; a shared prefix is stored once and a branch starts at the
first token where two calls differ (docs/design.md invariant 1). Nodes live in flat numpy arrays,
never one Python object per token. A later call's prompt that contains an earlier completion reuses
those nodes, which keep their policy flag, behaviour logprob and weight version.

Storage: each call appends at most one new *run* (a contiguous chain of node ids whose parent is
the previous id, except the run's first node). Records come in reference form (the parent's
shared token count + the call's own tokens, `gyre.tito.records.ModelCall`), so building costs
O(the calls' own tokens), never a whole prompt per call: a call that extends its parent starts at
the parent's last node; one that branches off starts at the parent's node at the divergence depth
(walking runs up, one Python step per run); a call without a parent walks from the root. Matching
walks runs and compares whole slices vectorised. Reading the records' Python ints dominates the
cost. The tree knows nothing about rewards, selection, packing or models.

Array suffix legend: `_N` one entry per node (token) of the tree, `_R` one entry per run (= call).
"""

from __future__ import annotations

import array
from collections.abc import Sequence
from typing import TypeGuard

import msgspec
import numpy as np

from gyre.tito.records import ROLES, FullCall, ModelCall, Role, to_reference

__all__ = ["TrajectoryTree", "TreeStatistics", "build_tree"]

_ROLE_INDEX: dict[str, int] = {role: i for i, role in enumerate(ROLES)}


class TreeStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """A snapshot of one tree's size (docs/style.md rule 6)."""

    calls: int
    """Model-call records the tree was built from."""
    tokens_in_calls: int
    """Sum over calls of len(prompt) + len(completion): what per-call rows would store."""
    unique_tokens: int
    """Nodes the tree stores: every shared prefix once."""
    policy_tokens: int
    """Nodes sampled by the policy (they carry loss when selected)."""
    branches: int
    """Leaves, i.e. root-to-leaf trajectories."""
    branch_points: int
    """Nodes with two or more children (plus one if the tree has several roots)."""
    depth: int
    """Tokens on the longest root-to-leaf path."""


class TrajectoryTree:
    """The prefix tree of one execution's model calls (read-only after `build_tree`).

    Node ids are 0..N-1; a parent's id is always smaller than its child's. Per node (`_N`, numpy):

    - `token_N` int32: token ID.
    - `parent_N` int32: parent node id, -1 for a root.
    - `depth_N` int32: 0-based position along the node's own root path (its position id).
    - `policy_N` bool: sampled by the policy (a completion token of some call).
    - `logprob_N` float64: behaviour logprob in nats of a policy node; NaN for context nodes.
    - `version_N` int32: weight version that sampled a policy node; -1 for context nodes.
    - `temperature_N` float64: sampling temperature of a policy node's call; NaN for context.
    - `call_N` int32: index into `call_ids` of the call that created the node.
    - `role_N` int8: index into `gyre.tito.records.ROLES` of that call's role.
    - `path_policy_N` int32: policy nodes on the root path up to and including the node.

    Per run/call (`_R`): `run_start_R`, `run_len_R` (the nodes the call added, possibly 0),
    `run_parent_R` (parent node of the run's first node) and `end_node_R` (the node of the call's
    last token). `call_ids`, `call_roles` follow record order.
    """

    __slots__ = (
        "execution_id",
        "call_ids",
        "call_roles",
        "token_N",
        "parent_N",
        "depth_N",
        "policy_N",
        "logprob_N",
        "version_N",
        "temperature_N",
        "call_N",
        "role_N",
        "path_policy_N",
        "run_start_R",
        "run_len_R",
        "run_parent_R",
        "end_node_R",
        "divergence_R",
        "tokens_in_calls",
    )

    execution_id: str
    call_ids: list[str]
    call_roles: list[Role]
    token_N: np.ndarray
    parent_N: np.ndarray
    depth_N: np.ndarray
    policy_N: np.ndarray
    logprob_N: np.ndarray
    version_N: np.ndarray
    temperature_N: np.ndarray
    call_N: np.ndarray
    role_N: np.ndarray
    path_policy_N: np.ndarray
    run_start_R: np.ndarray
    run_len_R: np.ndarray
    run_parent_R: np.ndarray
    end_node_R: np.ndarray
    divergence_R: np.ndarray
    tokens_in_calls: int

    def __init__(self, **arrays: object) -> None:
        for name in self.__slots__:
            setattr(self, name, arrays[name])

    def __len__(self) -> int:
        return int(self.token_N.shape[0])

    def __repr__(self) -> str:
        return (
            f"TrajectoryTree(execution_id={self.execution_id!r}, calls={len(self.call_ids)}, "
            f"nodes={len(self)})"
        )

    @property
    def num_nodes(self) -> int:
        return len(self)

    def leaves(self) -> np.ndarray:
        """Node ids (int64, ascending) of the leaves: one per root-to-leaf trajectory."""
        has_child = np.zeros(len(self), dtype=bool)
        parents = self.parent_N[self.parent_N >= 0]
        has_child[parents] = True
        return np.flatnonzero(~has_child)

    def leaf_roles(self, leaves: np.ndarray) -> list[Role]:
        """Role of each trajectory: the role of the call that created its leaf."""
        return [ROLES[int(r)] for r in self.role_N[leaves]]

    def path(self, node: int) -> np.ndarray:
        """Node ids (int64) from the root to `node` inclusive, walking runs (not tokens)."""
        if not 0 <= node < len(self):
            raise ValueError(f"node={node} is not in a tree of {len(self)} nodes")
        pieces = []
        while node >= 0:
            run = int(self.call_N[node])
            start = int(self.run_start_R[run])
            pieces.append(np.arange(start, node + 1, dtype=np.int64))
            node = int(self.run_parent_R[run])
        return np.concatenate(pieces[::-1])

    def divergence_index(self, call_id: str) -> int | None:
        """First index where the call's prompt differs from its parent call's prompt + completion.

        None when the call has no parent or its prompt extends the parent's tokens exactly.
        Raises `ValueError` for an unknown call id.
        """
        try:
            index = self.call_ids.index(call_id)
        except ValueError:
            raise ValueError(
                f"call_id={call_id!r} is not in execution {self.execution_id!r}"
            ) from None
        value = int(self.divergence_R[index])
        return None if value < 0 else value

    def statistics(self) -> TreeStatistics:
        n = len(self)
        children = np.bincount(self.parent_N[self.parent_N >= 0], minlength=n) if n else np.zeros(0)
        roots = int(np.count_nonzero(self.parent_N < 0))
        return TreeStatistics(
            calls=len(self.call_ids),
            tokens_in_calls=int(self.tokens_in_calls),
            unique_tokens=n,
            policy_tokens=int(np.count_nonzero(self.policy_N)),
            branches=int(self.leaves().shape[0]),
            branch_points=int(np.count_nonzero(children >= 2)) + (1 if roots > 1 else 0),
            depth=int(self.depth_N.max()) + 1 if n else 0,
        )


def _check_call(call: ModelCall) -> None:
    n = len(call.completion_ids)
    if len(call.logprobs) != n or len(call.versions) != n:
        raise ValueError(
            f"call {call.call_id!r}: len(completion_ids)={n}, len(logprobs)={len(call.logprobs)}, "
            f"len(versions)={len(call.versions)} must be equal"
        )
    if call.prompt_len == 0:
        raise ValueError(
            f"call {call.call_id!r}: prompt_ids is empty (nothing predicts its first token)"
        )
    if call.role not in _ROLE_INDEX:
        raise ValueError(f"call {call.call_id!r}: role={call.role!r} is not one of {ROLES}")
    if call.shared_len < 0 or (call.shared_len and call.parent_call_id is None):
        raise ValueError(
            f"call {call.call_id!r}: shared_len={call.shared_len} needs a parent_call_id "
            "(and must be >= 0)"
        )


def _in_reference_form(calls: Sequence[ModelCall | FullCall]) -> TypeGuard[Sequence[ModelCall]]:
    return not any(isinstance(call, FullCall) for call in calls)


def build_tree(calls: Sequence[ModelCall | FullCall]) -> TrajectoryTree:
    """Merge one execution's model calls into a `TrajectoryTree`, in O(the calls' own tokens).

    `calls` in record order (a call's parent, if named, comes before it), in reference form
    (`ModelCall`); `FullCall`s (whole prompts: tests, old logs) are first put in reference form
    (`gyre.tito.records.to_reference`, O(their tokens)). A call's first `shared_len` tokens are
    its parent's: the walk starts at the parent's node at that depth (found by walking runs up
    from the parent's last node), never re-reading a shared prompt. Its own tokens (prompt tail
    + completion) are walked down the existing tree; the unmatched rest becomes a new run whose
    completion part is marked policy with the call's logprobs and versions. A completion token
    that lands on an existing context node turns it into a policy node (the token was sampled);
    one landing on an existing policy node keeps the first record's logprob and version.

    Raises `ValueError` for an empty list, calls of several executions, duplicate call ids,
    an empty prompt, a parent named after its child, a `shared_len` without a parent or longer
    than the parent's prompt + completion, or completion/logprob/version lengths that differ.
    """
    if not calls:
        raise ValueError("build_tree needs at least one model call")
    refs = calls if _in_reference_form(calls) else to_reference(calls)
    execution_id = refs[0].execution_id
    call_ids: list[str] = []
    index_of: dict[str, int] = {}
    for call in refs:
        _check_call(call)
        if call.execution_id != execution_id:
            raise ValueError(
                f"call {call.call_id!r} has execution_id={call.execution_id!r}, "
                f"expected {execution_id!r}"
            )
        if call.call_id in index_of:
            raise ValueError(f"duplicate call_id={call.call_id!r} in execution {execution_id!r}")
        if call.parent_call_id is not None and call.parent_call_id not in index_of:
            raise ValueError(
                f"call {call.call_id!r}: parent_call_id={call.parent_call_id!r} "
                "does not come before it"
            )
        index_of[call.call_id] = len(call_ids)
        call_ids.append(call.call_id)

    num_calls = len(refs)
    run_start_R = np.zeros(num_calls, dtype=np.int64)
    run_len_R = np.zeros(num_calls, dtype=np.int64)
    run_parent_R = np.full(num_calls, -1, dtype=np.int64)
    run_depth_R = np.zeros(num_calls, dtype=np.int64)
    end_node_R = np.full(num_calls, -1, dtype=np.int64)
    divergence_R = np.full(num_calls, -1, dtype=np.int64)
    seq_len_R = np.zeros(num_calls, dtype=np.int64)  # prompt + completion length per call
    # Runs as Python lists (read one element at a time while walking up: no numpy scalars).
    up_run: list[int] = []  # the run holding each run's parent node (-1: the virtual root)
    up_i: list[int] = []  # that node's index in its run
    depth_of: list[int] = []  # depth of each run's first node
    end_at: list[tuple[int, int]] = []  # each call's last node as (run, index in run)
    run_tokens: list[np.ndarray] = []
    run_policy: list[np.ndarray] = []
    run_logprob: list[np.ndarray] = []
    run_version: list[np.ndarray] = []
    run_temperature: list[np.ndarray] = []
    branch_child: dict[tuple[int, int], int] = {}  # (parent node, token) -> run starting there
    num_nodes = 0
    tokens_in_calls = 0

    for r, call in enumerate(refs):
        shared = call.shared_len
        prompt_len = len(call.prompt_tail)  # the call's own prompt tokens
        seq = _as_int32(call.prompt_tail, call.completion_ids)
        seq_len_R[r] = shared + seq.shape[0]
        tokens_in_calls += shared + seq.shape[0]
        # (cur_run, cur_i) is the deepest matched node, (-1, -1) the virtual root.
        cur_run, cur_i = -1, -1
        if call.parent_call_id is not None:
            p = index_of[call.parent_call_id]
            parent_len = int(seq_len_R[p])
            if shared > parent_len:
                raise ValueError(
                    f"call {call.call_id!r}: shared_len={shared} > {parent_len} tokens of "
                    f"parent {call.parent_call_id!r}"
                )
            if shared < parent_len:
                divergence_R[r] = shared
            if shared:  # the parent's node at depth shared - 1: walk its path up, run by run
                cur_run, cur_i = end_at[p]
                while depth_of[cur_run] > shared - 1:
                    cur_run, cur_i = up_run[cur_run], up_i[cur_run]
                cur_i = shared - 1 - depth_of[cur_run]

        matched: list[tuple[int, int, int, int]] = []  # (run, first index, seq position, length)
        pos, length = 0, seq.shape[0]
        while pos < length:
            token = int(seq[pos])
            interior = cur_run >= 0 and cur_i + 1 < run_len_R[cur_run]
            if interior and run_tokens[cur_run][cur_i + 1] == token:
                nxt_run, nxt_i = cur_run, cur_i + 1
            else:
                parent = int(run_start_R[cur_run]) + cur_i if cur_run >= 0 else -1
                nxt_run = branch_child.get((parent, token), -1)
                if nxt_run < 0:
                    break
                nxt_i = 0
            along = run_tokens[nxt_run][nxt_i:]
            n = min(along.shape[0], length - pos)
            differ = np.flatnonzero(along[:n] != seq[pos : pos + n])
            k = int(differ[0]) if differ.shape[0] else n
            matched.append((nxt_run, nxt_i, pos, k))
            pos += k
            cur_run, cur_i = nxt_run, nxt_i + k - 1

        # Completion tokens that matched existing nodes: context nodes become policy nodes.
        for run, first, at, k in matched:
            lo = max(at, prompt_len)
            if lo >= at + k:
                continue
            sl = slice(first + lo - at, first + k)
            src = slice(lo - prompt_len, at + k - prompt_len)
            fresh = ~run_policy[run][sl]
            if fresh.any():
                lps = np.asarray(call.logprobs[src], dtype=np.float64)
                run_logprob[run][sl][fresh] = lps[fresh]
                run_version[run][sl][fresh] = np.asarray(call.versions[src], dtype=np.int32)[fresh]
                run_temperature[run][sl][fresh] = call.sampling.temperature
                run_policy[run][sl] = True

        parent_node = int(run_start_R[cur_run]) + cur_i if cur_run >= 0 else -1
        new = seq[pos:].copy()  # not a view: it would keep the whole sequence alive
        run_start_R[r] = num_nodes
        run_len_R[r] = new.shape[0]
        run_parent_R[r] = parent_node
        run_depth_R[r] = shared + pos
        up_run.append(cur_run)
        up_i.append(cur_i)
        depth_of.append(shared + pos)
        policy = np.zeros(new.shape[0], dtype=bool)
        logprob = np.full(new.shape[0], np.nan, dtype=np.float64)
        version = np.full(new.shape[0], -1, dtype=np.int32)
        temperature = np.full(new.shape[0], np.nan, dtype=np.float64)
        first_policy = max(prompt_len - pos, 0)
        if first_policy < new.shape[0]:
            src = slice(pos + first_policy - prompt_len, None)
            policy[first_policy:] = True
            logprob[first_policy:] = call.logprobs[src]
            version[first_policy:] = call.versions[src]
            temperature[first_policy:] = call.sampling.temperature
        run_tokens.append(new)
        run_policy.append(policy)
        run_logprob.append(logprob)
        run_version.append(version)
        run_temperature.append(temperature)
        if new.shape[0]:
            branch_child[(parent_node, int(new[0]))] = r
            end_node_R[r] = num_nodes + new.shape[0] - 1
            end_at.append((r, new.shape[0] - 1))
        else:
            end_node_R[r] = parent_node
            end_at.append((cur_run, cur_i))
        num_nodes += new.shape[0]

    return _finish(
        execution_id=execution_id,
        calls=refs,
        call_ids=call_ids,
        run_tokens=run_tokens,
        run_policy=run_policy,
        run_logprob=run_logprob,
        run_version=run_version,
        run_temperature=run_temperature,
        run_start_R=run_start_R,
        run_len_R=run_len_R,
        run_parent_R=run_parent_R,
        run_depth_R=run_depth_R,
        end_node_R=end_node_R,
        divergence_R=divergence_R,
        tokens_in_calls=tokens_in_calls,
    )


def _as_int32(prompt: list[int], completion: list[int]) -> np.ndarray:
    """prompt + completion as one int32 array; array.array reads Python ints ~25% faster than
    np.asarray on a concatenated list, and frombuffer shares its buffer without a copy."""
    buf = array.array("i", prompt)
    buf.extend(completion)
    return np.frombuffer(buf, dtype=np.int32)


def _finish(
    *,
    execution_id,
    calls,
    call_ids,
    run_tokens,
    run_policy,
    run_logprob,
    run_version,
    run_temperature,
    run_start_R,
    run_len_R,
    run_parent_R,
    run_depth_R,
    end_node_R,
    divergence_R,
    tokens_in_calls,
) -> TrajectoryTree:
    """Concatenate the runs into flat per-node arrays and derive parents, depths, path counts."""
    num_calls = len(calls)
    token_N = np.concatenate(run_tokens) if run_tokens else np.zeros(0, np.int32)
    policy_N = np.concatenate(run_policy)
    logprob_N = np.concatenate(run_logprob)
    version_N = np.concatenate(run_version)
    temperature_N = np.concatenate(run_temperature)
    n = token_N.shape[0]
    call_N = np.repeat(np.arange(num_calls, dtype=np.int32), run_len_R)
    call_role_R = np.array([_ROLE_INDEX[c.role] for c in calls], dtype=np.int8)
    role_N = call_role_R[call_N]
    # Inside a run, node i's parent is i - 1; each run's first node points at the run's parent.
    parent_N = np.arange(-1, n - 1, dtype=np.int32)
    has_nodes = run_len_R > 0
    parent_N[run_start_R[has_nodes]] = run_parent_R[has_nodes]
    offset_N = np.arange(n, dtype=np.int64) - np.repeat(run_start_R, run_len_R)
    depth_N = (np.repeat(run_depth_R, run_len_R) + offset_N).astype(np.int32)
    path_policy_N = np.zeros(n, dtype=np.int32)
    for r in np.flatnonzero(has_nodes):  # runs in creation order: a run's parent is already done
        start, length, parent = int(run_start_R[r]), int(run_len_R[r]), int(run_parent_R[r])
        base = path_policy_N[parent] if parent >= 0 else 0
        path_policy_N[start : start + length] = base + np.cumsum(policy_N[start : start + length])
    return TrajectoryTree(
        execution_id=execution_id,
        call_ids=call_ids,
        call_roles=[c.role for c in calls],
        token_N=token_N,
        parent_N=parent_N,
        depth_N=depth_N,
        policy_N=policy_N,
        logprob_N=logprob_N,
        version_N=version_N,
        temperature_N=temperature_N,
        call_N=call_N,
        role_N=role_N,
        path_policy_N=path_policy_N,
        run_start_R=run_start_R,
        run_len_R=run_len_R,
        run_parent_R=run_parent_R,
        end_node_R=end_node_R,
        divergence_R=divergence_R,
        tokens_in_calls=tokens_in_calls,
    )
