"""The `learnable` suite: tiny, regular tool-use tasks a model of a few million parameters can
learn.

Owns `learnable_suite` (the 32 shipped tasks: write a word to a file) and `learnable_examples`
(fresh instruction + solution pairs of the same kind, drawn with their own seed, for warm-start
demonstrations). Knows nothing about agents, models or the other suites.
"""

from __future__ import annotations

import random

from gyre.tasks.solution import Solution, Step
from gyre.tasks.suites.files import TaskFiles

__all__ = ["learnable_examples", "learnable_suite"]


_L_WORDS = [
    "apple",
    "river",
    "stone",
    "cloud",
    "green",
    "tiger",
    "lemon",
    "pearl",
    "maple",
    "sugar",
    "blue",
    "seven",
    "house",
    "light",
    "music",
    "ocean",
]
_L_FILES = ["a.txt", "b.txt", "out.txt", "word.txt", "note.txt", "x.txt", "data.txt", "answer.txt"]


def _learnable_pair(rng: random.Random) -> tuple[str, str]:
    return rng.choice(_L_WORDS), rng.choice(_L_FILES)


def _learnable_instruction(word: str, path: str) -> str:
    return f"Write the word {word} to the file {path}."


def _learnable_task(index: int, word: str, path: str) -> TaskFiles:
    return TaskFiles(
        name=f"{index:03d}-{word}-{path.replace('.', '-')}",
        instruction=_learnable_instruction(word, path) + "\n",
        difficulty=1,
        tags=("learnable", "tool-use"),
        deadline_s=60.0,
        max_turns=4,
        token_budget=512,
        group_size=8,
        environment={},
        tests={
            "test_word.py": (
                '"""Hidden tests (generated)."""\n\n\n'
                f"def test_file_exists():\n    import os\n    assert os.path.isfile({path!r})\n\n\n"
                f"def test_word():\n    assert open({path!r}).read().strip() == {word!r}\n"
            )
        },
        solution=Solution(
            main=[
                Step(tool="write_file", arguments={"path": path, "content": word}, tests_passing=2)
            ]
        ),
        num_tests=2,
        verifier_timeout_s=60.0,
    )


def learnable_examples(count: int, seed: int) -> list[tuple[str, Solution]]:
    """`count` (instruction, solution) pairs of the `learnable` kind for demonstrations.

    Drawn with their own seed, so they may or may not coincide with shipped tasks; use a seed
    other than the suite's to hold the shipped tasks out. Raises `ValueError` for count < 0."""
    if count < 0:
        raise ValueError(f"count={count} must be >= 0")
    rng = random.Random(f"{seed}:learnable-demos")
    out = []
    for _ in range(count):
        word, path = _learnable_pair(rng)
        out.append(
            (
                _learnable_instruction(word, path) + "\n",
                Solution(
                    main=[
                        Step(
                            tool="write_file",
                            arguments={"path": path, "content": word},
                            tests_passing=2,
                        )
                    ]
                ),
            )
        )
    return out


def learnable_suite(seed: int) -> list[TaskFiles]:
    rng = random.Random(f"{seed}:learnable")
    pairs = rng.sample([(w, f) for w in _L_WORDS for f in _L_FILES], 32)
    return [_learnable_task(i, w, f) for i, (w, f) in enumerate(pairs)]
