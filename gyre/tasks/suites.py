"""The shipped task suites, generated from a seed: `nl2repo-mini`, `terminal-mini`,
`multiagent-mini`, `learnable` and `longtail` (the schedule benchmark's workload, for the agent
`gyre.agents.longtail`).

Owns the generators (`generate_suite`, `generate_all`, `SUITES`) and `learnable_examples` (fresh
instruction + solution pairs of the `learnable` kind for warm-start demonstrations). Every task is
written in the format of `gyre.tasks.task` with a reference solution (`solution/oracle.json`)
whose main steps record how many hidden tests pass after each (`tests_passing`). Expected test
values are computed by running the reference implementation, so the oracle scores 1.0 by
construction; the generated folders are byte-identical for equal seeds. Knows nothing about
agents or models.
"""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gyre.tasks.solution import Solution, Step, encode_solution

__all__ = ["SUITES", "generate_suite", "generate_all", "learnable_examples", "TaskFiles"]


# --------------------------------------------------------------------------------------------
# writing task folders


@dataclass
class TaskFiles:
    """Everything of one generated task before it is written."""

    name: str
    instruction: str
    difficulty: int
    tags: tuple[str, ...]
    deadline_s: float
    max_turns: int
    token_budget: int
    group_size: int
    environment: dict[str, str]
    tests: dict[str, str]
    solution: Solution
    verifier_kind: str = "pytest"
    num_tests: int | None = None
    verifier_timeout_s: float = 120.0
    test_timeout_s: float = 10.0


def _toml_str(s: str) -> str:
    return json.dumps(s)  # a JSON string is a valid TOML basic string for our ASCII text


def _task_toml(t: TaskFiles) -> str:
    lines = [
        "version = 1",
        "",
        "[metadata]",
        f"difficulty = {t.difficulty}",
        f"tags = [{', '.join(_toml_str(x) for x in t.tags)}]",
        "",
        "[agent]",
        f"deadline_s = {float(t.deadline_s)}",
        f"max_turns = {t.max_turns}",
        f"token_budget = {t.token_budget}",
        "",
        "[training]",
        f"group_size = {t.group_size}",
        "",
        "[verifier]",
        f"kind = {_toml_str(t.verifier_kind)}",
        f"timeout_s = {float(t.verifier_timeout_s)}",
        f"test_timeout_s = {float(t.test_timeout_s)}",
    ]
    if t.num_tests is not None:
        lines.append(f"num_tests = {t.num_tests}")
    return "\n".join(lines) + "\n"


def _write_task(suite_dir: Path, t: TaskFiles) -> None:
    root = suite_dir / t.name
    root.mkdir(parents=True)
    (root / "instruction.md").write_text(t.instruction)
    (root / "task.toml").write_text(_task_toml(t))
    (root / "environment").mkdir()
    for rel, content in sorted(t.environment.items()):
        p = root / "environment" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(content)
    if not t.environment:
        (root / "environment" / ".keep").write_text("")
    (root / "tests").mkdir()
    for rel, content in sorted(t.tests.items()):
        (root / "tests" / rel).write_text(content)
    (root / "solution").mkdir()
    (root / "solution" / "oracle.json").write_bytes(encode_solution(t.solution) + b"\n")


# --------------------------------------------------------------------------------------------
# nl2repo-mini and multiagent-mini: functions specified in words, hidden pytest per function


@dataclass
class Function:
    """One function of a package: spec sentence, reference code and test calls."""

    name: str
    signature: str
    spec: str
    code: str
    cases: list[tuple] = field(default_factory=list)


def _t_add(rng):
    k = rng.randint(2, 99)
    return Function("add_{k}".format(k=k), "(x: int) -> int", f"return `x + {k}`.",
                    f"def add_{k}(x):\n    return x + {k}\n", [(rng.randint(-50, 50),), (rng.randint(100, 999),)])


def _t_clamp(rng):
    lo = rng.randint(-20, 0)
    hi = rng.randint(1, 30)
    return Function("clamp", "(x: int) -> int", f"return `x` limited to the range [{lo}, {hi}] (inclusive).",
                    f"def clamp(x):\n    return max({lo}, min({hi}, x))\n", [(lo - 5,), (hi + 3,), ((lo + hi) // 2,)][: 2 + rng.randint(0, 1)])


def _t_vowels(rng):
    words = ["Banana", "sky", "AEIOUxyz", "Programming", "queue", "rhythm"]
    return Function("count_vowels", "(s: str) -> int",
                    "return how many characters of `s` are vowels (a, e, i, o, u, in either case).",
                    "def count_vowels(s):\n    return sum(c in 'aeiouAEIOU' for c in s)\n",
                    [(w,) for w in rng.sample(words, 2)])


def _t_palindrome(rng):
    cases = ["A man, a plan, a canal: Panama", "Hello", "No lemon, no melon", "abca", "Was it a car or a cat I saw"]
    return Function("is_palindrome", "(s: str) -> bool",
                    "return True if `s` reads the same backwards when only letters and digits are kept "
                    "and case is ignored, else False.",
                    "def is_palindrome(s):\n    t = [c.lower() for c in s if c.isalnum()]\n    return t == t[::-1]\n",
                    [(c,) for c in rng.sample(cases, 2)])


def _t_fizz(rng):
    a, b = rng.choice([(3, 5), (2, 7), (4, 6), (3, 7)])
    w1, w2 = rng.choice([("Fizz", "Buzz"), ("Foo", "Bar"), ("Ping", "Pong")])
    return Function("fizzbuzz", "(n: int) -> list[str]",
                    f"return a list of the strings for 1..n: \"{w1}{w2}\" for multiples of both {a} and {b}, "
                    f"\"{w1}\" for multiples of {a}, \"{w2}\" for multiples of {b}, else the number as a string.",
                    f"def fizzbuzz(n):\n    out = []\n    for i in range(1, n + 1):\n"
                    f"        if i % {a} == 0 and i % {b} == 0:\n            out.append('{w1}{w2}')\n"
                    f"        elif i % {a} == 0:\n            out.append('{w1}')\n"
                    f"        elif i % {b} == 0:\n            out.append('{w2}')\n"
                    f"        else:\n            out.append(str(i))\n    return out\n",
                    [(rng.randint(5, 9),), (rng.randint(14, 30),)])


def _t_rle(rng):
    return Function("rle_encode", "(s: str) -> str",
                    "run-length encode `s`: each run of equal characters becomes the character followed by "
                    "the run length, e.g. \"aaab\" -> \"a3b1\"; the empty string gives \"\".",
                    "def rle_encode(s):\n    out = []\n    i = 0\n    while i < len(s):\n        j = i\n"
                    "        while j < len(s) and s[j] == s[i]:\n            j += 1\n"
                    "        out.append(s[i] + str(j - i))\n        i = j\n    return ''.join(out)\n",
                    [("".join(rng.choice("ab") * rng.randint(1, 4) for _ in range(4)),), ("",)])


def _t_caesar(rng):
    k = rng.randint(1, 25)
    return Function("shift_letters", "(s: str) -> str",
                    f"shift every lowercase letter a-z of `s` forward by {k} places in the alphabet, wrapping "
                    "around after z; other characters are unchanged.",
                    f"def shift_letters(s):\n    return ''.join(chr((ord(c) - 97 + {k}) % 26 + 97) if 'a' <= c <= 'z' else c for c in s)\n",
                    [("hello world",), ("xyz-ABC",)])


def _t_freq(rng):
    texts = ["the cat and the hat", "a b a c b a", "One one ONE two", "to be or not to be"]
    return Function("word_counts", "(text: str) -> dict[str, int]",
                    "return a dict mapping each word of `text` (split on whitespace, lowercased) to how "
                    "often it occurs.",
                    "def word_counts(text):\n    out = {}\n    for w in text.lower().split():\n"
                    "        out[w] = out.get(w, 0) + 1\n    return out\n",
                    [(t,) for t in rng.sample(texts, 2)])


def _t_flatten(rng):
    return Function("flatten", "(xs: list) -> list",
                    "return the items of the arbitrarily nested list `xs` as one flat list, in order.",
                    "def flatten(xs):\n    out = []\n    for x in xs:\n        if isinstance(x, list):\n"
                    "            out.extend(flatten(x))\n        else:\n            out.append(x)\n    return out\n",
                    [([1, [2, [3, 4]], 5],), ([[], ["a"], [["b"]]],)])


def _t_chunk(rng):
    n = rng.randint(2, 4)
    return Function("chunks", "(xs: list) -> list[list]",
                    f"split `xs` into consecutive lists of {n} items; the last one may be shorter.",
                    f"def chunks(xs):\n    return [xs[i:i + {n}] for i in range(0, len(xs), {n})]\n",
                    [(list(range(rng.randint(5, 11))),), ([],)])


def _t_dedupe(rng):
    return Function("dedupe", "(xs: list) -> list",
                    "return `xs` without repeated items, keeping the first occurrence of each in order.",
                    "def dedupe(xs):\n    seen = set()\n    out = []\n    for x in xs:\n        if x not in seen:\n"
                    "            seen.add(x)\n            out.append(x)\n    return out\n",
                    [([rng.randint(0, 5) for _ in range(10)],), (list("mississippi"),)])


def _t_gcd(rng):
    return Function("gcd", "(a: int, b: int) -> int",
                    "return the greatest common divisor of the non-negative integers `a` and `b` (gcd(0, 0) == 0).",
                    "def gcd(a, b):\n    while b:\n        a, b = b, a % b\n    return a\n",
                    [(rng.randint(10, 200) * 6, rng.randint(10, 200) * 4), (0, rng.randint(1, 50))])


def _t_primes(rng):
    return Function("primes_below", "(n: int) -> list[int]",
                    "return all prime numbers smaller than `n`, in increasing order.",
                    "def primes_below(n):\n    return [p for p in range(2, n) if all(p % d for d in range(2, int(p ** 0.5) + 1))]\n",
                    [(rng.randint(10, 60),), (2,)])


def _t_running(rng):
    return Function("running_sum", "(xs: list[int]) -> list[int]",
                    "return the list of prefix sums of `xs` (element i is the sum of xs[0..i]).",
                    "def running_sum(xs):\n    out = []\n    total = 0\n    for x in xs:\n        total += x\n"
                    "        out.append(total)\n    return out\n",
                    [([rng.randint(-9, 9) for _ in range(6)],), ([],)])


def _t_slug(rng):
    return Function("slugify", "(s: str) -> str",
                    "lowercase `s`, replace every run of characters that are not a-z or 0-9 by one \"-\", "
                    "and strip \"-\" from both ends.",
                    "import re\n\n\ndef slugify(s):\n    return re.sub(r'[^a-z0-9]+', '-', s.lower()).strip('-')\n",
                    [("Hello, World!",), ("  Ultra--Long  Horizon 2026 ",)])


def _t_kv(rng):
    sep = rng.choice([";", ",", "|"])
    return Function("parse_pairs", "(s: str) -> dict[str, str]",
                    f"parse a string like \"a=1{sep}b=2\" into {{\"a\": \"1\", \"b\": \"2\"}}: pairs are separated by "
                    f"\"{sep}\", key and value by the first \"=\", surrounding spaces are stripped, empty pairs ignored.",
                    f"def parse_pairs(s):\n    out = {{}}\n    for part in s.split({sep!r}):\n        if not part.strip():\n"
                    f"            continue\n        k, v = part.split('=', 1)\n        out[k.strip()] = v.strip()\n    return out\n",
                    [(f"x=1{sep} y = two {sep}",), (f"k=v=w{sep}{sep}a=b",)])


def _t_transpose(rng):
    return Function("transpose", "(m: list[list]) -> list[list]",
                    "return the transpose of the rectangular matrix `m` given as a list of rows.",
                    "def transpose(m):\n    return [list(r) for r in zip(*m)]\n",
                    [([[1, 2, 3], [4, 5, 6]],), ([[rng.randint(0, 9)]],)])


def _t_roman(rng):
    return Function("to_roman", "(n: int) -> str",
                    "return the Roman numeral of 1 <= n <= 3999 (subtractive notation, e.g. 4 -> \"IV\").",
                    "def to_roman(n):\n    vals = [(1000, 'M'), (900, 'CM'), (500, 'D'), (400, 'CD'), (100, 'C'), (90, 'XC'),\n"
                    "            (50, 'L'), (40, 'XL'), (10, 'X'), (9, 'IX'), (5, 'V'), (4, 'IV'), (1, 'I')]\n"
                    "    out = ''\n    for v, s in vals:\n        while n >= v:\n            out += s\n            n -= v\n    return out\n",
                    [(rng.randint(1, 50),), (rng.randint(1000, 3999),)])


def _t_digits(rng):
    return Function("digit_sum", "(n: int) -> int",
                    "return the sum of the decimal digits of the integer `n` (the sign is ignored).",
                    "def digit_sum(n):\n    return sum(int(c) for c in str(abs(n)))\n",
                    [(rng.randint(1000, 99999),), (-rng.randint(10, 99),)])


def _t_fib(rng):
    a, b = rng.choice([(0, 1), (2, 1), (1, 3)])
    return Function("seq_term", "(n: int) -> int",
                    f"return term n (n >= 0) of the sequence t0 = {a}, t1 = {b}, t(n) = t(n-1) + t(n-2).",
                    f"def seq_term(n):\n    x, y = {a}, {b}\n    for _ in range(n):\n        x, y = y, x + y\n    return x\n",
                    [(rng.randint(0, 3),), (rng.randint(10, 25),)])


def _t_median(rng):
    return Function("median", "(xs: list[float]) -> float",
                    "return the median of the non-empty list `xs` (the mean of the two middle values when "
                    "the length is even), as a float.",
                    "def median(xs):\n    s = sorted(xs)\n    m = len(s) // 2\n    return float(s[m]) if len(s) % 2 else (s[m - 1] + s[m]) / 2\n",
                    [([rng.randint(0, 20) for _ in range(5)],), ([rng.randint(0, 20) for _ in range(4)],)])


def _t_longer(rng):
    n = rng.randint(3, 5)
    return Function("long_words", "(text: str) -> list[str]",
                    f"return the words of `text` (split on whitespace) longer than {n} characters, in order.",
                    f"def long_words(text):\n    return [w for w in text.split() if len(w) > {n}]\n",
                    [("an agent trains on extremely long executions",), ("tiny",)])


def _t_rotate(rng):
    k = rng.randint(1, 3)
    return Function("rotate", "(xs: list) -> list",
                    f"return `xs` rotated left by {k} places (item {k} comes first); an empty list stays empty "
                    f"and the rotation wraps around for short lists.",
                    f"def rotate(xs):\n    if not xs:\n        return []\n    k = {k} % len(xs)\n    return xs[k:] + xs[:k]\n",
                    [(list(range(6)),), (["a", "b"],)])


def _t_vowel_first(rng):
    return Function("initials", "(name: str) -> str",
                    "return the upper-case first letters of the space-separated words of `name`, joined with "
                    "dots and ending with a dot, e.g. \"ada lovelace\" -> \"A.L.\".",
                    "def initials(name):\n    return ''.join(w[0].upper() + '.' for w in name.split())\n",
                    [("grace brewster hopper",), ("alan",)])


def _t_bin(rng):
    width = rng.choice([4, 8])
    return Function("to_bits", "(n: int) -> str",
                    f"return the binary representation of 0 <= n < 2**{width} as exactly {width} characters of 0 and 1.",
                    f"def to_bits(n):\n    return format(n, '0{width}b')\n",
                    [(rng.randint(0, 2**width - 1),), (0,)])


_TEMPLATES = [
    _t_add, _t_clamp, _t_vowels, _t_palindrome, _t_fizz, _t_rle, _t_caesar, _t_freq, _t_flatten,
    _t_chunk, _t_dedupe, _t_gcd, _t_primes, _t_running, _t_slug, _t_kv, _t_transpose, _t_roman,
    _t_digits, _t_fib, _t_median, _t_longer, _t_rotate, _t_vowel_first, _t_bin,
]

_ADJ = ["tiny", "swift", "calm", "bold", "amber", "lunar", "misty", "quick", "brave", "noble", "solar", "vivid"]
_NOUN = ["otter", "falcon", "maple", "harbor", "comet", "ember", "willow", "canyon", "heron", "quartz", "meadow"]
_MODULES = ["core", "text", "numbers", "lists", "utils", "convert", "parse", "maths", "seqs", "strings"]


def _expected(fn: Function, args: tuple):
    ns: dict = {}
    exec(fn.code, ns)  # noqa: S102 - our own reference implementation
    return ns[fn.name](*args)


@dataclass
class _Module:
    name: str
    functions: list[Function]

    def code(self) -> str:
        imports = sorted({line for f in self.functions for line in f.code.splitlines() if line.startswith("import ")})
        bodies = ["\n".join(line for line in f.code.splitlines() if not line.startswith("import ")).strip("\n")
                  for f in self.functions]
        head = "\n".join(imports) + "\n\n\n" if imports else ""
        return f'"""{self.name}: generated reference solution."""\n\n' + head + "\n\n\n".join(bodies) + "\n"

    def spec(self, pkg: str) -> str:
        lines = [f"### Module `{pkg}/{self.name}.py`", ""]
        for f in self.functions:
            lines.append(f"- `{f.name}{f.signature}`: {f.spec}")
        return "\n".join(lines)

    def tests(self, pkg: str) -> tuple[str, int]:
        out = ['"""Hidden tests (generated)."""', ""]
        n = 0
        for f in self.functions:
            for i, args in enumerate(f.cases):
                expected = _expected(f, args)
                call = f"{f.name}({', '.join(repr(a) for a in args)})"
                out += ["", f"def test_{f.name}_{i}():",
                        f"    from {pkg}.{self.name} import {f.name}",
                        f"    assert {call} == {expected!r}", ""]
                n += 1
        return "\n".join(out).rstrip() + "\n", n


def _package(rng: random.Random, num_functions: int, per_module: int) -> tuple[str, list[_Module]]:
    pkg = f"{rng.choice(_ADJ)}_{rng.choice(_NOUN)}"
    templates = rng.sample(_TEMPLATES, num_functions)
    functions = [t(rng) for t in templates]
    names = rng.sample(_MODULES, (num_functions + per_module - 1) // per_module)
    modules = [_Module(name, functions[i * per_module:(i + 1) * per_module]) for i, name in enumerate(names)]
    return pkg, modules


def _nl2repo_task(index: int, seed: int, suite: str, multiagent: bool) -> TaskFiles:
    rng = random.Random(f"{seed}:{suite}:{index}")
    if multiagent:
        difficulty = 2 + index % 3  # 2..4 modules of 2 functions
        pkg, modules = _package(rng, 2 * difficulty, 2)
    else:
        difficulty = 1 + index % 5  # 2..6 functions in modules of up to 2
        pkg, modules = _package(rng, difficulty + 1, 2)
    tests: dict[str, str] = {}
    total = 0
    steps = [Step(tool="write_file", arguments={"path": f"{pkg}/__init__.py", "content": f'"""{pkg}."""\n'},
                  tests_passing=0)]
    sub_agents: dict[str, list[Step]] = {}
    for m in modules:
        text, n = m.tests(pkg)
        tests[f"test_{m.name}.py"] = text
        total += n
        write = Step(tool="write_file", arguments={"path": f"{pkg}/{m.name}.py", "content": m.code()})
        if multiagent:
            sub_task = (f"In the Python package `{pkg}` (the folder `{pkg}/` in the workspace), write this module:\n\n"
                        + m.spec(pkg) + "\n\nWrite only this module, then call finish.")
            sub_agents[sub_task] = [write]
            steps.append(Step(tool="delegate", arguments={"task": sub_task}, tests_passing=total))
        else:
            steps.append(Step(tool=write.tool, arguments=write.arguments, tests_passing=total))
    body = "\n\n".join(m.spec(pkg) for m in modules)
    intro = (f"# Build the Python package `{pkg}`\n\n"
             f"Create the package `{pkg}` in the workspace: a folder `{pkg}/` with an `__init__.py` and the "
             f"modules below. Hidden tests import each function from its module and check it on examples.\n\n")
    if multiagent:
        intro += (f"The {len(modules)} modules are independent. Delegate each module to a sub-agent with the "
                  "`delegate` tool, passing its full specification, and write `__init__.py` yourself.\n\n")
    return TaskFiles(
        name=f"{index:03d}-{pkg.replace('_', '-')}",
        instruction=intro + "## Modules\n\n" + body + "\n",
        difficulty=difficulty if not multiagent else difficulty + 1,
        tags=("python", "multiagent" if multiagent else "nl2repo"),
        deadline_s=600.0 * difficulty if multiagent else 300.0 * difficulty,
        max_turns=20 + 10 * difficulty,
        token_budget=8192 * difficulty,
        group_size=4,
        environment={"README.md": f"Workspace for the `{pkg}` package.\n"},
        tests=tests,
        solution=Solution(main=steps, sub_agents=sub_agents),
        num_tests=total,
    )


# --------------------------------------------------------------------------------------------
# terminal-mini: file manipulation, text processing, configuration edits


@dataclass
class _Sub:
    """One terminal sub-goal: a sentence, files it needs, one oracle step, hidden test functions."""

    sentence: str
    environment: dict[str, str]
    step: Step
    tests: list[str]


_NAMES = ["Alice", "Bob", "Carol", "Dave", "Erin", "Frank", "Grace", "Heidi", "Ivan", "Judy", "Mallory", "Oscar"]
_WORDS = ["apple", "river", "stone", "cloud", "ember", "tiger", "lemon", "pearl", "maple", "sugar", "violet", "copper"]


def _s_sort(rng):
    names = rng.sample(_NAMES, 7)
    return _Sub(
        "Write the lines of `names.txt` sorted alphabetically to `sorted.txt` (one name per line).",
        {"names.txt": "\n".join(names) + "\n"},
        Step(tool="run", arguments={"command": "LC_ALL=C sort names.txt > sorted.txt"}),
        [f"def test_sorted():\n    assert open('sorted.txt').read().split() == {sorted(names)!r}\n"],
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
        f"In `settings.ini`, set `port` in section `[server]` to {port}, leaving every other setting unchanged.",
        {"settings.ini": before},
        Step(tool="write_file", arguments={"path": "settings.ini", "content": after}),
        [
            "def test_ini_port():\n    import configparser\n    c = configparser.ConfigParser()\n"
            f"    c.read('settings.ini')\n    assert c['server']['port'] == '{port}'\n",
            "def test_ini_unchanged():\n    import configparser\n    c = configparser.ConfigParser()\n"
            f"    c.read('settings.ini')\n    assert c['server']['host'] == '{host}' and c['logging']['level'] == 'info'\n",
        ],
    )


def _s_json(rng):
    level = rng.choice(["debug", "warning", "error"])
    data = {"name": rng.choice(_WORDS), "logging": {"level": "info", "file": "app.log"}, "workers": rng.randint(1, 8)}
    new = json.loads(json.dumps(data))
    new["logging"]["level"] = level
    return _Sub(
        f"In `config.json`, set `logging.level` to `\"{level}\"`, leaving every other key unchanged.",
        {"config.json": json.dumps(data, indent=2) + "\n"},
        Step(tool="write_file", arguments={"path": "config.json", "content": json.dumps(new, indent=2) + "\n"}),
        [
            f"def test_json_level():\n    import json\n    assert json.load(open('config.json'))['logging']['level'] == '{level}'\n",
            "def test_json_unchanged():\n    import json\n    d = json.load(open('config.json'))\n"
            f"    assert d['name'] == {data['name']!r} and d['workers'] == {data['workers']} and d['logging']['file'] == 'app.log'\n",
        ],
    )


def _s_rename(rng):
    stems = rng.sample(_WORDS, 3)
    env = {f"notes/{s}.txt": f"note about {s}\n" for s in stems}
    return _Sub(
        "Rename every `.txt` file in the folder `notes/` to the same name with the extension `.md`.",
        env,
        Step(tool="run", arguments={"command": 'for f in notes/*.txt; do mv "$f" "${f%.txt}.md"; done'}),
        [
            "def test_renamed():\n    import os\n"
            f"    assert sorted(os.listdir('notes')) == {sorted(s + '.md' for s in stems)!r}\n",
            f"def test_renamed_content():\n    assert open('notes/{stems[0]}.md').read() == 'note about {stems[0]}\\n'\n",
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
        [f"def test_replaced():\n    assert open('story.txt').read() == {(text.replace(a, b) + chr(10))!r}\n"],
    )


def _s_csv(rng):
    rows = [(n, rng.randint(20, 70), rng.choice(["Paris", "Lima", "Oslo", "Kyoto", "Accra"])) for n in rng.sample(_NAMES, 5)]
    csv = "name,age,city\n" + "".join(f"{n},{a},{c}\n" for n, a, c in rows)
    return _Sub(
        "Write the `city` column of `people.csv` (without the header) to `cities.txt`, one per line, in file order.",
        {"people.csv": csv},
        Step(tool="run", arguments={"command": "tail -n +2 people.csv | cut -d, -f3 > cities.txt"}),
        [f"def test_cities():\n    assert open('cities.txt').read().split() == {[c for _, _, c in rows]!r}\n"],
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
            "def test_tmp_gone():\n    import os\n    assert not [f for f in os.listdir('work') if f.endswith('.tmp')]\n",
            f"def test_others_kept():\n    import os\n    assert sorted(os.listdir('work')) == {sorted(k + '.dat' for k in keep)!r}\n",
        ],
    )


def _s_mkdirs(rng):
    dirs = rng.sample(["src", "docs", "tests", "data", "scripts", "build"], 3)
    return _Sub(
        f"Create the folders {', '.join(f'`{d}/`' for d in dirs)}, each containing an empty file `.keep`.",
        {},
        Step(tool="run", arguments={"command": " && ".join(f"mkdir -p {d} && touch {d}/.keep" for d in dirs)}),
        [f"def test_dirs():\n    import os\n    assert all(os.path.isfile(d + '/.keep') for d in {dirs!r})\n"],
    )


def _s_unique(rng):
    words = [rng.choice(_WORDS[:6]) for _ in range(15)]
    return _Sub(
        "Write the distinct words of `words.txt` (one word per line), sorted alphabetically, to `unique.txt`.",
        {"words.txt": "\n".join(words) + "\n"},
        Step(tool="run", arguments={"command": "LC_ALL=C sort -u words.txt > unique.txt"}),
        [f"def test_unique():\n    assert open('unique.txt').read().split() == {sorted(set(words))!r}\n"],
    )


def _s_concat(rng):
    parts = [f"part {i}: {rng.choice(_WORDS)}\n" for i in range(1, 4)]
    return _Sub(
        "Concatenate `parts/part1.txt`, `parts/part2.txt` and `parts/part3.txt`, in that order, into `combined.txt`.",
        {f"parts/part{i + 1}.txt": p for i, p in enumerate(parts)},
        Step(tool="run", arguments={"command": "cat parts/part1.txt parts/part2.txt parts/part3.txt > combined.txt"}),
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
            f"def test_env_added():\n    assert open('.env').read().splitlines()[-1] == '{key}={value}'\n",
            "def test_env_kept():\n    assert open('.env').read().splitlines()[:2] == ['DEBUG=0', 'REGION=eu']\n",
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


_SUBS = [_s_sort, _s_errors, _s_ini, _s_json, _s_rename, _s_replace, _s_csv, _s_tmp, _s_mkdirs, _s_unique,
         _s_concat, _s_env, _s_head]

_CHECK_PY = '''"""Runs the hidden checks of test_checks.py and writes reward.json (passed, total)."""
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

_TEST_SH = '#!/bin/bash\n# Hidden verifier: writes $GYRE_REWARD_DIR/reward.json\nexec "${GYRE_PYTHON:-python3}" "$GYRE_TESTS_DIR/check.py"\n'


def _terminal_task(index: int, seed: int) -> TaskFiles:
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
    body = '"""Hidden tests (generated); they run in a copy of the workspace."""\n\n\n' + "\n\n".join(tests_code)
    script = index % 4 == 3  # every fourth task: a test.sh verifier that writes a reward
    tests = {"test.sh": _TEST_SH, "check.py": _CHECK_PY, "test_checks.py": body} if script else {"test_files.py": body}
    instruction = ("# Terminal task\n\nWork in the workspace folder with shell commands or file tools:\n\n"
                   + "\n".join(f"{i + 1}. {s.sentence}" for i, s in enumerate(subs)) + "\n")
    return TaskFiles(
        name=f"{index:03d}-" + "-".join(t.__name__[3:] for t in templates),
        instruction=instruction, difficulty=difficulty, tags=("terminal",),
        deadline_s=120.0 * difficulty, max_turns=10 + 5 * difficulty, token_budget=4096 * difficulty,
        group_size=4, environment=env, tests=tests, solution=Solution(main=steps),
        verifier_kind="script" if script else "pytest", num_tests=None if script else total,
        verifier_timeout_s=60.0,
    )


# --------------------------------------------------------------------------------------------
# learnable: tiny, regular tool-use tasks for a model of a few million parameters

_L_WORDS = ["apple", "river", "stone", "cloud", "green", "tiger", "lemon", "pearl", "maple", "sugar",
            "blue", "seven", "house", "light", "music", "ocean"]
_L_FILES = ["a.txt", "b.txt", "out.txt", "word.txt", "note.txt", "x.txt", "data.txt", "answer.txt"]


def _learnable_pair(rng: random.Random) -> tuple[str, str]:
    return rng.choice(_L_WORDS), rng.choice(_L_FILES)


def _learnable_instruction(word: str, path: str) -> str:
    return f"Write the word {word} to the file {path}."


def _learnable_task(index: int, word: str, path: str) -> TaskFiles:
    return TaskFiles(
        name=f"{index:03d}-{word}-{path.replace('.', '-')}",
        instruction=_learnable_instruction(word, path) + "\n",
        difficulty=1, tags=("learnable", "tool-use"),
        deadline_s=60.0, max_turns=4, token_budget=512, group_size=8,
        environment={}, tests={"test_word.py": (
            '"""Hidden tests (generated)."""\n\n\n'
            f"def test_file_exists():\n    import os\n    assert os.path.isfile({path!r})\n\n\n"
            f"def test_word():\n    assert open({path!r}).read().strip() == {word!r}\n")},
        solution=Solution(main=[Step(tool="write_file", arguments={"path": path, "content": word}, tests_passing=2)]),
        num_tests=2, verifier_timeout_s=60.0,
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
        out.append((_learnable_instruction(word, path) + "\n",
                    Solution(main=[Step(tool="write_file", arguments={"path": path, "content": word}, tests_passing=2)])))
    return out


# --------------------------------------------------------------------------------------------
# longtail: the schedule benchmark's workload (`python -m gyre.agents.longtail` writes result.json)

_LONGTAIL_CHECK_PY = '''"""Scores result.json: turns done / turns planned; 0 without a readable file."""
import json
import os

passed, total = 0, 1
try:
    with open("result.json") as f:
        data = json.load(f)
    planned, done = int(data["turns_planned"]), int(data["turns_done"])
    if planned >= 1:
        passed, total = max(0, min(done, planned)), planned
except (OSError, ValueError, KeyError, TypeError):
    pass
with open(os.path.join(os.environ["GYRE_REWARD_DIR"], "reward.json"), "w") as f:
    json.dump({"passed": passed, "total": total}, f)
'''

_LT_SYSTEMS = ["billing", "search", "auth", "storage", "scheduler", "gateway", "mailer", "indexer", "cache",
               "ledger", "metrics", "uploader"]
_LT_CHORES = ["port the {s} service to the new build system", "find why the {s} tests are flaky",
              "refactor the {s} module into smaller packages", "add tracing to every {s} endpoint",
              "migrate the {s} configuration to TOML", "raise the {s} test coverage above 90%"]


def _longtail_task(index: int, seed: int) -> TaskFiles:
    rng = random.Random(f"{seed}:longtail:{index}")
    system = rng.choice(_LT_SYSTEMS)
    chore = rng.choice(_LT_CHORES).format(s=system)
    result = json.dumps({"turns_planned": 1, "turns_done": 1, "finished": True}) + "\n"
    return TaskFiles(
        name=f"{index:03d}-{system}",
        instruction=f"# Long-horizon task\n\nIn the {system} repository, {chore}. Work in small steps; "
                    "each step runs a long tool call.\n",
        difficulty=1, tags=("longtail", "benchmark"),
        deadline_s=3600.0, max_turns=64, token_budget=65536, group_size=4,
        environment={}, tests={"test.sh": _TEST_SH, "check.py": _LONGTAIL_CHECK_PY},
        solution=Solution(main=[Step(tool="write_file", arguments={"path": "result.json", "content": result},
                                     tests_passing=1)]),
        verifier_kind="script", verifier_timeout_s=60.0,
    )


# --------------------------------------------------------------------------------------------
# suites


def _learnable_suite(seed: int) -> list[TaskFiles]:
    rng = random.Random(f"{seed}:learnable")
    pairs = rng.sample([(w, f) for w in _L_WORDS for f in _L_FILES], 32)
    return [_learnable_task(i, w, f) for i, (w, f) in enumerate(pairs)]


SUITES: dict[str, Callable[[int], list[TaskFiles]]] = {
    "nl2repo-mini": lambda seed: [_nl2repo_task(i, seed, "nl2repo-mini", False) for i in range(55)],
    "terminal-mini": lambda seed: [_terminal_task(i, seed) for i in range(33)],
    "multiagent-mini": lambda seed: [_nl2repo_task(i, seed, "multiagent-mini", True) for i in range(21)],
    "learnable": _learnable_suite,
    "longtail": lambda seed: [_longtail_task(i, seed) for i in range(16)],
}
"""Suite name -> generator of its tasks from a seed."""


def generate_suite(name: str, out: str | Path, seed: int = 0) -> Path:
    """Write suite `name` generated from `seed` to `out/<name>/`, replacing what was there.

    Raises `ValueError` for an unknown suite name."""
    if name not in SUITES:
        raise ValueError(f"name={name!r} is not a suite; known: {sorted(SUITES)}")
    suite_dir = Path(out) / name
    if suite_dir.exists():
        shutil.rmtree(suite_dir)
    suite_dir.mkdir(parents=True)
    for t in SUITES[name](seed):
        _write_task(suite_dir, t)
    return suite_dir


def generate_all(out: str | Path, seed: int = 0) -> list[Path]:
    """Write every suite of `SUITES` under `out`."""
    return [generate_suite(name, out, seed) for name in SUITES]
