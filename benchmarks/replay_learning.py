"""Offline replay of the `make run` RL loop on first calls: a check of a warm start and a learning
rate in a few minutes a seed, before spending an hour of `bench_learning` on them.

What it keeps from the real loop (examples/cpu.toml): the training / held-out split
(`split_tasks`), the data order (`pick_tasks`), `batch_executions` / `group_size`, the reference
agent's first prompt (encoded like `gyre.model.demonstrations.encode_conversation`), T=1 sampling,
the hidden tests' score (half for the file at the right path, all for the exact word: a learnable
task is decided by the first call), group-baseline advantages (`group_advantages`), the PPO loss
(`policy_loss`, each execution's tokens averaged, then the executions) and AdamW with the
trainer's settings, warm-up and grad-norm clip. What it drops: the `finish` call (so no
execution is stopped at a limit and `rl.stop_penalty` never applies), vLLM, DeepSpeed and the
processes (transformers samples and trains in this process), so its numbers are
a guide, not the benchmark. Writes benchmarks/results/replay_learning.json: held-out pass rate
before and after `--steps` steps per seed (`--eval-samples` first calls per held-out task).

Run: .venv/bin/python -m benchmarks.replay_learning --model runs/model-tiny-sft [--steps 16]
     [--seeds 0 1 2]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import time
from pathlib import Path

import torch

from benchmarks.common import print_table, write_result
from gyre.agents.tools import SYSTEM_PROMPT, TOOL_SCHEMAS
from gyre.config import load_config
from gyre.engines.schedule import warmup_scheduler
from gyre.model.demonstrations import generation_prompt
from gyre.rl.advantages import group_advantages
from gyre.rl.loss import policy_loss
from gyre.rollout.tasks import pick_tasks, split_tasks
from gyre.tasks.solution import load_solution

_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)


def first_prompt(tokenizer, instruction: str) -> list[int]:
    """The reference agent's first prompt, as `offline_pass_rate` builds it."""
    messages = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": instruction},
    ]
    return generation_prompt(tokenizer, messages, TOOL_SCHEMAS)


def score(text: str, word: str, path: str) -> float:
    """The hidden tests' score of a first call: 0, 0.5 (file at `path`) or 1 (it holds `word`)."""
    match = _CALL.search(text)
    try:
        call = json.loads(match.group(1)) if match else {}
        args = call["arguments"]
        if call["name"] != "write_file" or args["path"] != path:
            return 0.0
        return 1.0 if str(args["content"]).strip() == word else 0.5
    except (ValueError, KeyError, TypeError):
        return 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--config", default="examples/cpu.toml")
    parser.add_argument("--model", required=True, help="warm-started model folder")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--learning-rate", type=float, default=None, help="default: the config's trainer"
    )
    parser.add_argument("--eval-samples", type=int, default=32)
    args = parser.parse_args()
    if not Path(args.model, "config.json").is_file():  # else transformers asks the Hub for it
        parser.error(f"--model {args.model}: no model folder there (a warm start writes one)")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = load_config(args.config)
    lr = args.learning_rate or config.trainer.learning_rate
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    train, heldout = split_tasks(config)

    def unpack(task):
        [step] = load_solution(task).main
        return (
            first_prompt(tokenizer, task.instruction),
            step.arguments["content"],
            step.arguments["path"],
        )

    prompts = {t.task_id: unpack(t) for t in train + heldout}
    torch.set_num_threads(1)
    rows = []
    for seed in args.seeds:
        t0 = time.perf_counter()
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)

        @torch.no_grad()
        def sample(task_id: str, n: int) -> list[tuple[list[int], float]]:
            prompt, word, path = prompts[task_id]
            ids = torch.tensor([prompt] * n)
            out = model.generate(  # noqa: B023 called only within this seed's iteration
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=48,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
            )
            rows_ = []
            for row in out[:, len(prompt) :].tolist():
                if tokenizer.eos_token_id in row:
                    row = row[: row.index(tokenizer.eos_token_id) + 1]
                rows_.append((row, score(tokenizer.decode(row), word, path)))
            return rows_

        def evaluate() -> float:
            model.eval()  # noqa: B023 called only within this seed's iteration
            results = [r for t in heldout for _, r in sample(t.task_id, args.eval_samples)]
            return sum(r == 1.0 for r in results) / len(results)

        def logprobs(task_id: str, completion: list[int]) -> torch.Tensor:
            prompt = prompts[task_id][0]
            logits = (
                model(torch.tensor([prompt + completion]))  # noqa: B023 used within this iteration
                .logits[0, len(prompt) - 1 : -1]
                .float()
            )
            return torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion)[:, None])[:, 0]

        before = evaluate()
        t = config.trainer
        opt = torch.optim.AdamW(
            model.parameters(),
            lr=lr,
            betas=(t.adam_beta1, t.adam_beta2),
            eps=t.adam_eps,
            weight_decay=t.weight_decay,
        )
        scheduler = warmup_scheduler(opt, t.warmup_steps)
        tasks_per_step = config.loop.batch_executions // config.loop.group_size
        for step in range(args.steps):
            batch = []  # (task id, completion, advantage)
            for task in pick_tasks(
                train, step * tasks_per_step, tasks_per_step, config.seed + seed
            ):
                group = sample(task.task_id, config.loop.group_size)
                adv = group_advantages(
                    [str(i) for i in range(len(group))], [r for _, r in group]
                ).advantages
                batch += [(task.task_id, c, a) for (c, _), a in zip(group, adv)]
            model.eval()
            with torch.no_grad():
                behaviour = [logprobs(tid, c) for tid, c, _ in batch]
            model.train()
            opt.zero_grad()
            for (tid, c, a), old in zip(batch, behaviour):
                lp = logprobs(tid, c)
                weight = torch.full_like(lp, 1.0 / (len(c) * len(batch)))
                loss, _ = policy_loss(
                    lp,
                    old,
                    torch.full_like(lp, a),
                    weight,
                    torch.ones_like(lp, dtype=torch.bool),
                    clip_eps=config.rl.clip_eps,
                    is_cap=config.rl.is_cap,
                )
                loss.backward()
            if t.grad_clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
            opt.step()
            if scheduler is not None:
                scheduler.step()
        after = evaluate()
        rows.append(
            {
                "seed": seed,
                "before": before,
                "after": after,
                "gain_points": 100 * (after - before),
                "wall_s": time.perf_counter() - t0,
            }
        )
        print(rows[-1], flush=True)
    gains = [r["gain_points"] for r in rows]
    numbers = {"gain_points": gains, "gain_points_mean": statistics.fmean(gains), "per_seed": rows}
    cfg = {
        "config": args.config,
        "model": args.model,
        "steps": args.steps,
        "seeds": args.seeds,
        "learning_rate": lr,
        "eval_samples": args.eval_samples,
    }
    path = write_result("replay_learning", cfg, numbers)
    print_table("offline replay: held-out pass rate before / after", rows)
    print(f"mean gain {numbers['gain_points_mean']:.1f} points; wrote {path}")


if __name__ == "__main__":
    main()
