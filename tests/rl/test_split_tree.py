"""Trees split into DFS chunks (docs/design.md invariant 4 for trees over `micro_batch_tokens`).

A tree larger than the token budget is cut into chunks that each attend to their ancestors'
cached K/V (`gyre.kernels.cached_tree_attention`). Over random executions (hypothesis: branching,
rewritten histories, shared system prompts, every role) and random budgets and query blocks, the
logprobs, the loss and every gradient summed over a batch's micro-batches equal those of running
each selected trajectory alone with plain causal attention (float64, relative 1e-6).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gyre.config import RLConfig, TrainerConfig
from gyre.errors import ContextLengthError
from gyre.kernels import TreeKVCache, ancestor_paths, check_attention_backend
from gyre.kernels.cached_tree_attention import check_logprob_backend
from gyre.rl import packed_logprobs, policy_loss
from gyre.trajectory import build_tree, pack_batch, select_trajectories
from tests.rl.models import path_logprobs, tiny_qwen2
from tests.trajectory.builders import make_call, random_execution

MODEL = tiny_qwen2(seed=1, vocab=8)


def _grads(model, loss):
    model.zero_grad(set_to_none=True)
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@settings(max_examples=10, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    jmax=st.integers(1, 8),
    executions=st.integers(1, 3),
    budget=st.integers(1, 40),
    query_block=st.integers(1, 9),
)
def test_split_trees_train_exactly_like_separate_trajectories(
    seed, jmax, executions, budget, query_block
):
    rng = np.random.default_rng(seed)
    trees = [
        build_tree(
            random_execution(seed + i, execution_id=f"e{i}", vocab=8, max_calls=10, max_new=8)
        )
        for i in range(executions)
    ]
    items = [(t, select_trajectories(t, jmax)) for t in trees]
    batches = pack_batch(items, token_budget=budget)
    index = {tree.execution_id: e for e, tree in enumerate(trees)}
    # every tree over the budget is cut into chunks of the budget, the others are never cut
    for b in batches:
        if b.num_tokens > budget:
            assert len(b.execution_ids) == 1
            assert b.chunk_start_C.tolist() == list(range(0, b.num_tokens, budget))
        else:
            assert b.chunk_start_C.tolist() == [0]
    advantage_E = rng.normal(size=executions)
    loss_packed = torch.zeros((), dtype=torch.float64)
    lp_by_key: dict[tuple[int, int], torch.Tensor] = {}
    behaviour_by_key: dict[tuple[int, int], torch.Tensor] = {}
    weight_by_key: dict[tuple[int, int], float] = {}
    for b in batches:
        positions = b.loss_positions()
        if positions.size == 0:
            continue
        lp, _ = packed_logprobs(MODEL, b, positions_N=positions, query_block=query_block)
        behaviour = lp.detach() + torch.as_tensor(rng.normal(scale=0.3, size=positions.size))
        execution_N = np.array([index[b.execution_ids[i]] for i in b.execution_T[positions]])
        weight = torch.as_tensor(b.loss_weight_T[positions])
        loss, _ = policy_loss(
            lp,
            behaviour,
            torch.as_tensor(advantage_E[execution_N]),
            weight,
            torch.ones(positions.size, dtype=torch.bool),
        )
        loss_packed = loss_packed + loss
        for j, p in enumerate(positions.tolist()):
            key = (int(execution_N[j]), int(b.node_T[p]))
            lp_by_key[key] = lp[j]
            behaviour_by_key[key] = behaviour[j]
            weight_by_key[key] = float(weight[j])
    if not lp_by_key:
        return
    grads_packed = _grads(MODEL, loss_packed)

    # Separate runs: every selected trajectory alone; a shared token splits its weight.
    terms = []
    for e, (tree, sel) in enumerate(items):
        for leaf in sel.leaves:
            path = tree.path(int(leaf))
            lps = path_logprobs(MODEL, tree.token_N[path].tolist())
            for i, node in enumerate(path[1:].tolist()):
                if (e, node) in lp_by_key:
                    terms.append(((e, node), lps[i]))
    count: dict[tuple[int, int], int] = {}
    for key, _ in terms:
        count[key] = count.get(key, 0) + 1
    assert sorted(count) == sorted(lp_by_key)  # every loss token lies on a selected path
    for key, value in terms:
        want = value.item()
        assert abs(lp_by_key[key].item() - want) <= 1e-9 * max(1.0, abs(want))
    keys = [key for key, _ in terms]
    loss_sep, _ = policy_loss(
        torch.stack([v for _, v in terms]),
        torch.stack([behaviour_by_key[k] for k in keys]),
        torch.as_tensor(advantage_E[[k[0] for k in keys]]),
        torch.tensor([weight_by_key[k] / count[k] for k in keys], dtype=torch.float64),
        torch.ones(len(keys), dtype=torch.bool),
    )
    assert abs(loss_sep.item() - loss_packed.item()) <= 1e-6 * max(abs(loss_sep.item()), 1e-12)
    grads_sep = _grads(MODEL, loss_sep)
    # a tensor whose true gradient is 0 (q of a query that sees one key) gets rounding noise:
    # its floor is relative to the largest gradient of the model
    floor = 1e-12 * max(g.abs().max().item() for g in grads_sep.values())
    for name, g in grads_sep.items():
        scale = g.abs().max().item()
        assert (grads_packed[name] - g).abs().max().item() <= 1e-6 * scale + floor, name


def test_ancestor_paths_equal_brute_force_on_a_hand_tree():
    # DFS layout of: 0 -> 1 -> 2 -> {3 -> 4, 5}, 6 (a second root) -> 7
    dfs_out = [6, 6, 6, 5, 5, 6, 8, 8]
    starts = [0, 3, 4, 5, 6, 7]
    assert ancestor_paths(dfs_out, starts) == [[], [0, 1, 2], [0, 1, 2, 3], [0, 1, 2], [], [6]]
    brute = [[k for k in range(a) if dfs_out[k] > a] for a in starts]
    assert ancestor_paths(dfs_out, starts) == brute


def test_a_chunk_reads_only_its_ancestors_and_itself():
    # The chunk [4, 6) of the hand tree above: keys = ancestors of 4 (0..3) + 4, 5; token 5 is
    # not a descendant of 3 or 4, so its mask row hides them.
    dfs_out_T = torch.tensor([6, 6, 6, 5, 5, 6, 8, 8])
    cache = TreeKVCache(dfs_out_T, [0, 4, 6], query_block=8)
    cache.begin_chunk(0)
    cache._k[0], cache._v[0] = [torch.zeros(1, 1, 4, 2)], [torch.zeros(1, 1, 4, 2)]
    assert cache.begin_chunk(1) == (4, 6)
    # [4, 6) straddles a branch point (5 is not 4's child): the masked fallback
    (blk,) = cache._plan
    assert blk.a == 4 and blk.key_K is not None and blk.key_K.tolist() == [0, 1, 2, 3, 4, 5]
    assert [(j, local.tolist()) for j, local in blk.picks] == [(0, [0, 1, 2, 3]), (1, [0, 1])]
    assert (cache.fast_blocks, cache.masked_blocks) == (1, 1)  # [0, 4) is one path
    with pytest.raises(ValueError, match="chunks run in order"):
        cache.begin_chunk(0)
    with pytest.raises(ValueError, match="chunk_starts"):
        TreeKVCache(dfs_out_T, [0, 5, 5])
    with pytest.raises(ValueError, match="query_block=0"):
        TreeKVCache(dfs_out_T, [0], query_block=0)


def test_a_path_longer_than_the_context_is_refused_naming_the_execution():
    model = tiny_qwen2(seed=2, vocab=8)
    model.config.max_position_embeddings = 12
    short = build_tree([make_call("short", "a", [1, 2, 3], [4, 5])])
    long = build_tree([make_call("long-one", "a", [1, 2, 3, 4, 5, 6, 7, 0], [1, 2, 3, 4, 5])])
    items = [(t, select_trajectories(t, 1)) for t in (short, long)]
    (ok, over) = pack_batch(items, token_budget=6)
    packed_logprobs(model, ok)
    with pytest.raises(ContextLengthError, match=r"'long-one'.* 13 tokens.*=12"):
        packed_logprobs(model, over)


def test_kernel_choices_are_checked_with_the_key_named():
    with pytest.raises(ValueError, match="trainer.attention='dense'"):
        TrainerConfig(attention="dense")
    with pytest.raises(ValueError, match="trainer.logprob_impl='cuda'"):
        TrainerConfig(logprob_impl="cuda")
    check_attention_backend("sdpa", "cpu")
    with pytest.raises(ValueError, match="attention='flex' trains only on a CUDA device"):
        check_attention_backend("flex", "cpu")
    check_logprob_backend("torch", "cpu")


def test_triton_on_cpu_without_the_interpreter_is_refused(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="logprob_impl='triton' needs a CUDA device"):
        check_logprob_backend("triton", "cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="flex + triton training needs CUDA")
def test_flex_and_triton_on_gpu_equal_the_cpu_reference():
    # The GPU kernels (FlexAttention BlockMask per chunk, Triton logprob) against the CPU path
    # (chunked SDPA, torch logprob) on a split tree: logprobs and gradients, float32.
    cpu = tiny_qwen2(seed=3, vocab=64, dtype=torch.float32)
    gpu = tiny_qwen2(seed=3, vocab=64, dtype=torch.float32).cuda()
    tree = build_tree(random_execution(11, vocab=64, max_calls=12, max_new=40))
    (batch,) = pack_batch([(tree, select_trajectories(tree, 8))], token_budget=37)
    assert batch.chunk_start_C.size > 1
    lp_cpu, ent_cpu = packed_logprobs(cpu, batch, attention="sdpa", impl="torch")
    lp_gpu, ent_gpu = packed_logprobs(gpu, batch, attention="flex", impl="triton")
    torch.testing.assert_close(lp_gpu.cpu(), lp_cpu, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(ent_gpu.cpu(), ent_cpu, rtol=1e-4, atol=1e-4)
    g_cpu = torch.autograd.grad(lp_cpu.sum(), list(cpu.parameters()))
    g_gpu = torch.autograd.grad(lp_gpu.sum(), list(gpu.parameters()))
    for a, b in zip(g_gpu, g_cpu):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-3, atol=1e-4)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.compile internals
def test_flex_chunks_forward_equals_sdpa_chunks_on_cpu():
    # FlexAttention runs forward-only on CPU: the per-chunk BlockMask path checked without grad.
    model = tiny_qwen2(seed=0, vocab=8, dtype=torch.float32)
    tree = build_tree(random_execution(3, vocab=8, max_calls=10, max_new=8))
    (batch,) = pack_batch([(tree, select_trajectories(tree, 8))], token_budget=9)
    assert batch.chunk_start_C.size > 1
    with torch.no_grad():
        ref, _ = packed_logprobs(model, batch, attention="sdpa")
        out, _ = packed_logprobs(model, batch, attention="flex")
    assert (out - ref).abs().max().item() <= 1e-5


@pytest.mark.slow  # imports DeepSpeed (~10 s)
@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal needs a machine without CUDA")
def test_trainer_start_refuses_gpu_kernels_without_cuda(tiny_model_dir, monkeypatch):
    from gyre.engines.trainer import DeepSpeedTrainer
    from gyre.errors import ConfigError
    from gyre.rl import PolicyObjective

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    objective = PolicyObjective(RLConfig())
    with pytest.raises(ConfigError, match="trainer.attention='flex': .*CUDA"):
        DeepSpeedTrainer(tiny_model_dir, TrainerConfig(attention="flex"), objective)
    with pytest.raises(ConfigError, match="trainer.logprob_impl='triton': .*CUDA"):
        DeepSpeedTrainer(tiny_model_dir, TrainerConfig(logprob_impl="triton"), objective)
