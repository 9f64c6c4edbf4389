"""The `terminal-mini` suite: file manipulation, text processing and configuration edits.

Owns `terminal_task` (one task from a seed and an index: one to three sub-goals drawn from the
templates, each a sentence, the files it needs, one oracle step and its hidden test functions).
Every fourth task is scored by a script verifier (`check.py` writing `reward.json`), the others
by pytest. Knows nothing about agents, models or the other suites.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

from gyre.tasks.solution import Solution, Step
from gyre.tasks.suites.files import TEST_SH, TaskFiles

__all__ = ["terminal_task"]


@dataclass
class _Sub:
    """One terminal sub-goal: a sentence, files it needs, one oracle step, hidden test functions."""

    sentence: str
    environment: dict[str, str]
    step: Step
    tests: list[str]


_NAMES = [
    "Alice",
    "Bob",
    "Carol",
    "Dave",
    "Erin",
    "Frank",
    "Grace",
    "Heidi",
    "Ivan",
    "Judy",
    "Mallory",
    "Oscar",
]
_WORDS = [
    "apple",
    "river",
    "stone",
    "cloud",
    "ember",
    "tiger",
    "lemon",
    "pearl",
    "maple",
    "sugar",
    "violet",
    "copper",
]


def _s_sort(rng):
    names = rng.sample(_NAMES, 7)
    return _Sub(
        "Write the lines of `names.txt` sorted alphabetically to `sorted.txt` (one name per line).",
        {"names.txt": "\n".join(names) + "\n"},
        Step(tool="run", arguments={"command": "LC_ALL=C sort names.txt > sorted.txt"}),
        [
            "def test_sorted():\n"
            f"    assert open('sorted.txt').read().split() == {sorted(names)!r}\n"
        ],
    )


def _s_errors(rng):
    lines, n = [], 0
    for i in range(rng.randint(10, 20)):
        level = rng.choice(["INFO", "INFO", "WARN", "ERROR"])
        n += level == "ERROR"
        lines.append(f"2026-01-01 00:00:{i:02d} {level} event {i}")
    return _Sub(
        "Write the number of lines of `app.log` that contain `ERROR` to `error_count.txt`.",
        {"app.log": "\n".join(lines) + "\n"},
        Step(tool="run", arguments={"command": "grep -c ERROR app.log > error_count.txt"}),
        [f"def test_error_count():\n    assert open('error_count.txt').read().strip() == '{n}'\n"],
    )


def _s_ini(rng):
    port = rng.randint(8000, 8999)
    old = rng.randint(3000, 3999)
    host = rng.choice(["localhost", "0.0.0.0", "example.org"])
    before = f"[server]\nhost = {host}\nport = {old}\n\n[logging]\nlevel = info\n"
    after = before.replace(f"port = {old}", f"port = {port}")
    return _Sub(
        f"In `settings.ini`, set `port` in section `[server]` to {port}, "
        "leaving every other setting unchanged.",
        {"settings.ini": before},
        Step(tool="write_file", arguments={"path": "settings.ini", "content": after}),
        [
            "def test_ini_port():\n    import configparser\n    c = configparser.ConfigParser()\n"
            f"    c.read('settings.ini')\n    assert c['server']['port'] == '{port}'\n",
            "def test_ini_unchanged():\n    import configparser\n"
            "    c = configparser.ConfigParser()\n"
            "    c.read('settings.ini')\n"
            f"    assert c['server']['host'] == '{host}' and c['logging']['level'] == 'info'\n",
        ],
    )


def _s_json(rng):
    level = rng.choice(["debug", "warning", "error"])
    data = {
        "name": rng.choice(_WORDS),
        "logging": {"level": "info", "file": "app.log"},
        "workers": rng.randint(1, 8),
    }
    new = json.loads(json.dumps(data))
    new["logging"]["level"] = level
    return _Sub(
        f'In `config.json`, set `logging.level` to `"{level}"`, leaving every other key unchanged.',
        {"config.json": json.dumps(data, indent=2) + "\n"},
        Step(
            tool="write_file",
            arguments={"path": "config.json", "content": json.dumps(new, indent=2) + "\n"},
        ),
        [
            "def test_json_level():\n    import json\n"
            f"    assert json.load(open('config.json'))['logging']['level'] == '{level}'\n",
            "def test_json_unchanged():\n    import json\n    d = json.load(open('config.json'))\n"
            f"    assert d['name'] == {data['name']!r} and d['workers'] == {data['workers']} "
            "and d['logging']['file'] == 'app.log'\n",
        ],
    )


def _s_rename(rng):
    stems = rng.sample(_WORDS, 3)
    env = {f"notes/{s}.txt": f"note about {s}\n" for s in stems}
    return _Sub(
        "Rename every `.txt` file in the folder `notes/` to the same name with the extension "
        "`.md`.",
        env,
        Step(
            tool="run",
            arguments={"command": 'for f in notes/*.txt; do mv "$f" "${f%.txt}.md"; done'},
        ),
        [
            "def test_renamed():\n    import os\n"
            f"    assert sorted(os.listdir('notes')) == {sorted(s + '.md' for s in stems)!r}\n",
            "def test_renamed_content():\n"
            f"    assert open('notes/{stems[0]}.md').read() == 'note about {stems[0]}\\n'\n",
        ],
    )


def _s_replace(rng):
    a, b = rng.sample(_WORDS, 2)
    text = " ".join(rng.choice([a, "the", "and", rng.choice(_WORDS)]) for _ in range(20))
    text = f"{a} {text} {a}"
    return _Sub(
        f"In `story.txt`, replace every occurrence of the word `{a}` with `{b}`.",
        {"story.txt": text + "\n"},
        Step(tool="run", arguments={"command": f"sed -i 's/{a}/{b}/g' story.txt"}),
        [
            "def test_replaced():\n"
            f"    assert open('story.txt').read() == {(text.replace(a, b) + chr(10))!r}\n"
        ],
    )


def _s_csv(rng):
    rows = [
        (n, rng.randint(20, 70), rng.choice(["Paris", "Lima", "Oslo", "Kyoto", "Accra"]))
        for n in rng.sample(_NAMES, 5)
    ]
    csv = "name,age,city\n" + "".join(f"{n},{a},{c}\n" for n, a, c in rows)
    return _Sub(
        "Write the `city` column of `people.csv` (without the header) to `cities.txt`, "
        "one per line, in file order.",
        {"people.csv": csv},
        Step(tool="run", arguments={"command": "tail -n +2 people.csv | cut -d, -f3 > cities.txt"}),
        [
            "def test_cities():\n"
            f"    assert open('cities.txt').read().split() == {[c for _, _, c in rows]!r}\n"
        ],
    )


def _s_tmp(rng):
    keep = rng.sample(_WORDS, 2)
    drop = rng.sample([w for w in _WORDS if w not in keep], 3)
    env = {f"work/{k}.dat": "keep\n" for k in keep} | {f"work/{d}.tmp": "junk\n" for d in drop}
    return _Sub(
        "Delete every `.tmp` file in the folder `work/`, keeping all other files.",
        env,
        Step(tool="run", arguments={"command": "rm -f work/*.tmp"}),
        [
            "def test_tmp_gone():\n    import os\n"
            "    assert not [f for f in os.listdir('work') if f.endswith('.tmp')]\n",
            "def test_others_kept():\n    import os\n"
            f"    assert sorted(os.listdir('work')) == {sorted(k + '.dat' for k in keep)!r}\n",
        ],
    )


def _s_mkdirs(rng):
    dirs = rng.sample(["src", "docs", "tests", "data", "scripts", "build"], 3)
    return _Sub(
        f"Create the folders {', '.join(f'`{d}/`' for d in dirs)}, "
        "each containing an empty file `.keep`.",
        {},
        Step(
            tool="run",
            arguments={"command": " && ".join(f"mkdir -p {d} && touch {d}/.keep" for d in dirs)},
        ),
        [
            "def test_dirs():\n    import os\n"
            f"    assert all(os.path.isfile(d + '/.keep') for d in {dirs!r})\n"
        ],
    )


def _s_unique(rng):
    words = [rng.choice(_WORDS[:6]) for _ in range(15)]
    return _Sub(
        "Write the distinct words of `words.txt` (one word per line), sorted alphabetically, "
        "to `unique.txt`.",
        {"words.txt": "\n".join(words) + "\n"},
        Step(tool="run", arguments={"command": "LC_ALL=C sort -u words.txt > unique.txt"}),
        [
            "def test_unique():\n"
            f"    assert open('unique.txt').read().split() == {sorted(set(words))!r}\n"
        ],
    )


def _s_concat(rng):
    parts = [f"part {i}: {rng.choice(_WORDS)}\n" for i in range(1, 4)]
    return _Sub(
        "Concatenate `parts/part1.txt`, `parts/part2.txt` and `parts/part3.txt`, in that order, "
        "into `combined.txt`.",
        {f"parts/part{i + 1}.txt": p for i, p in enumerate(parts)},
        Step(
            tool="run",
            arguments={
                "command": "cat parts/part1.txt parts/part2.txt parts/part3.txt > combined.txt"
            },
        ),
        [f"def test_combined():\n    assert open('combined.txt').read() == {''.join(parts)!r}\n"],
    )


def _s_env(rng):
    key = rng.choice(["API_PORT", "MAX_WORKERS", "CACHE_SIZE"])
    value = rng.randint(2, 999)
    return _Sub(
        f"Add the line `{key}={value}` at the end of the file `.env`, keeping its existing lines.",
        {".env": "DEBUG=0\nREGION=eu\n"},
        Step(tool="run", arguments={"command": f"echo {key}={value} >> .env"}),
        [
            "def test_env_added():\n"
            f"    assert open('.env').read().splitlines()[-1] == '{key}={value}'\n",
            "def test_env_kept():\n"
            "    assert open('.env').read().splitlines()[:2] == ['DEBUG=0', 'REGION=eu']\n",
        ],
    )


def _s_head(rng):
    n = rng.randint(2, 5)
    lines = [f"line {i} {rng.choice(_WORDS)}" for i in range(12)]
    return _Sub(
        f"Write the first {n} lines of `big.txt` to `head.txt`.",
        {"big.txt": "\n".join(lines) + "\n"},
        Step(tool="run", arguments={"command": f"head -n {n} big.txt > head.txt"}),
        [f"def test_head():\n    assert open('head.txt').read().splitlines() == {lines[:n]!r}\n"],
    )


_SUBS = [
    _s_sort,
    _s_errors,
    _s_ini,
    _s_json,
    _s_rename,
    _s_replace,
    _s_csv,
    _s_tmp,
    _s_mkdirs,
    _s_unique,
    _s_concat,
    _s_env,
    _s_head,
]

_CHECK_PY = '''\
"""Runs the hidden checks of test_checks.py and writes reward.json (passed, total)."""
import json
import os
import sys
import traceback

sys.path.insert(0, os.environ["GYRE_TESTS_DIR"])
import test_checks  # noqa: E402

names = [n for n in dir(test_checks) if n.startswith("test_")]
passed = 0
for name in names:
    try:
        getattr(test_checks, name)()
        passed += 1
    except Exception:
        traceback.print_exc()
with open(os.path.join(os.environ["GYRE_REWARD_DIR"], "reward.json"), "w") as f:
    json.dump({"passed": passed, "total": len(names)}, f)
'''


def terminal_task(index: int, seed: int) -> TaskFiles:
    rng = random.Random(f"{seed}:terminal-mini:{index}")
    difficulty = 1 + index % 3
    templates = rng.sample(_SUBS, difficulty)
    subs = [t(rng) for t in templates]
    env: dict[str, str] = {}
    tests_code: list[str] = []
    steps: list[Step] = []
    total = 0
    for s in subs:
        env |= s.environment
        tests_code += s.tests
        total += len(s.tests)
        steps.append(Step(tool=s.step.tool, arguments=s.step.arguments, tests_passing=total))
    body = (
        '"""Hidden tests (generated); they run in a copy of the workspace."""\n\n\n'
        + "\n\n".join(tests_code)
    )
    script = index % 4 == 3  # every fourth task: a test.sh verifier that writes a reward
    tests = (
        {"test.sh": TEST_SH, "check.py": _CHECK_PY, "test_checks.py": body}
        if script
        else {"test_files.py": body}
    )
    instruction = (
        "# Terminal task\n\nWork in the workspace folder with shell commands or file tools:\n\n"
        + "\n".join(f"{i + 1}. {s.sentence}" for i, s in enumerate(subs))
        + "\n"
    )
    return TaskFiles(
        name=f"{index:03d}-" + "-".join(t.__name__[3:] for t in templates),
        instruction=instruction,
        difficulty=difficulty,
        tags=("terminal",),
        deadline_s=120.0 * difficulty,
        max_turns=10 + 5 * difficulty,
        token_budget=4096 * difficulty,
        group_size=4,
        environment=env,
        tests=tests,
        solution=Solution(main=steps),
        verifier_kind="script" if script else "pytest",
        num_tests=None if script else total,
        verifier_timeout_s=60.0,
    )
