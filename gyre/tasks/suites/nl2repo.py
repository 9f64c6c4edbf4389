"""The `nl2repo-mini` and `multiagent-mini` suites: Python packages specified in words.

Owns `nl2repo_task` (one task from a seed and an index) and the function templates it draws from
(`Function`: spec sentence, reference code, test calls). Each task asks for a package of modules;
hidden pytest files check every function on examples whose expected values come from running the
reference code. In `multiagent-mini` the reference solution delegates each module to a sub-agent.
Knows nothing about agents, models or the other suites.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from gyre.tasks.solution import Solution, Step
from gyre.tasks.suites.files import TaskFiles

__all__ = ["Function", "nl2repo_task"]


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
    return Function(
        f"add_{k}",
        "(x: int) -> int",
        f"return `x + {k}`.",
        f"def add_{k}(x):\n    return x + {k}\n",
        [(rng.randint(-50, 50),), (rng.randint(100, 999),)],
    )


def _t_clamp(rng):
    lo = rng.randint(-20, 0)
    hi = rng.randint(1, 30)
    return Function(
        "clamp",
        "(x: int) -> int",
        f"return `x` limited to the range [{lo}, {hi}] (inclusive).",
        f"def clamp(x):\n    return max({lo}, min({hi}, x))\n",
        [(lo - 5,), (hi + 3,), ((lo + hi) // 2,)][: 2 + rng.randint(0, 1)],
    )


def _t_vowels(rng):
    words = ["Banana", "sky", "AEIOUxyz", "Programming", "queue", "rhythm"]
    return Function(
        "count_vowels",
        "(s: str) -> int",
        "return how many characters of `s` are vowels (a, e, i, o, u, in either case).",
        "def count_vowels(s):\n    return sum(c in 'aeiouAEIOU' for c in s)\n",
        [(w,) for w in rng.sample(words, 2)],
    )


def _t_palindrome(rng):
    cases = [
        "A man, a plan, a canal: Panama",
        "Hello",
        "No lemon, no melon",
        "abca",
        "Was it a car or a cat I saw",
    ]
    return Function(
        "is_palindrome",
        "(s: str) -> bool",
        "return True if `s` reads the same backwards when only letters and digits are kept "
        "and case is ignored, else False.",
        "def is_palindrome(s):\n    t = [c.lower() for c in s if c.isalnum()]\n"
        "    return t == t[::-1]\n",
        [(c,) for c in rng.sample(cases, 2)],
    )


def _t_fizz(rng):
    a, b = rng.choice([(3, 5), (2, 7), (4, 6), (3, 7)])
    w1, w2 = rng.choice([("Fizz", "Buzz"), ("Foo", "Bar"), ("Ping", "Pong")])
    return Function(
        "fizzbuzz",
        "(n: int) -> list[str]",
        f'return a list of the strings for 1..n: "{w1}{w2}" for multiples of both {a} and {b}, '
        f'"{w1}" for multiples of {a}, "{w2}" for multiples of {b}, else the number as a string.',
        f"def fizzbuzz(n):\n    out = []\n    for i in range(1, n + 1):\n"
        f"        if i % {a} == 0 and i % {b} == 0:\n            out.append('{w1}{w2}')\n"
        f"        elif i % {a} == 0:\n            out.append('{w1}')\n"
        f"        elif i % {b} == 0:\n            out.append('{w2}')\n"
        f"        else:\n            out.append(str(i))\n    return out\n",
        [(rng.randint(5, 9),), (rng.randint(14, 30),)],
    )


def _t_rle(rng):
    return Function(
        "rle_encode",
        "(s: str) -> str",
        "run-length encode `s`: each run of equal characters becomes the character followed by "
        'the run length, e.g. "aaab" -> "a3b1"; the empty string gives "".',
        "def rle_encode(s):\n    out = []\n    i = 0\n    while i < len(s):\n        j = i\n"
        "        while j < len(s) and s[j] == s[i]:\n            j += 1\n"
        "        out.append(s[i] + str(j - i))\n        i = j\n    return ''.join(out)\n",
        [("".join(rng.choice("ab") * rng.randint(1, 4) for _ in range(4)),), ("",)],
    )


def _t_caesar(rng):
    k = rng.randint(1, 25)
    return Function(
        "shift_letters",
        "(s: str) -> str",
        f"shift every lowercase letter a-z of `s` forward by {k} places in the alphabet, wrapping "
        "around after z; other characters are unchanged.",
        "def shift_letters(s):\n"
        f"    return ''.join(chr((ord(c) - 97 + {k}) % 26 + 97) if 'a' <= c <= 'z' else c "
        "for c in s)\n",
        [("hello world",), ("xyz-ABC",)],
    )


def _t_freq(rng):
    texts = ["the cat and the hat", "a b a c b a", "One one ONE two", "to be or not to be"]
    return Function(
        "word_counts",
        "(text: str) -> dict[str, int]",
        "return a dict mapping each word of `text` (split on whitespace, lowercased) to how "
        "often it occurs.",
        "def word_counts(text):\n    out = {}\n    for w in text.lower().split():\n"
        "        out[w] = out.get(w, 0) + 1\n    return out\n",
        [(t,) for t in rng.sample(texts, 2)],
    )


def _t_flatten(rng):
    return Function(
        "flatten",
        "(xs: list) -> list",
        "return the items of the arbitrarily nested list `xs` as one flat list, in order.",
        "def flatten(xs):\n    out = []\n    for x in xs:\n        if isinstance(x, list):\n"
        "            out.extend(flatten(x))\n        else:\n            out.append(x)\n"
        "    return out\n",
        [([1, [2, [3, 4]], 5],), ([[], ["a"], [["b"]]],)],
    )


def _t_chunk(rng):
    n = rng.randint(2, 4)
    return Function(
        "chunks",
        "(xs: list) -> list[list]",
        f"split `xs` into consecutive lists of {n} items; the last one may be shorter.",
        f"def chunks(xs):\n    return [xs[i:i + {n}] for i in range(0, len(xs), {n})]\n",
        [(list(range(rng.randint(5, 11))),), ([],)],
    )


def _t_dedupe(rng):
    return Function(
        "dedupe",
        "(xs: list) -> list",
        "return `xs` without repeated items, keeping the first occurrence of each in order.",
        "def dedupe(xs):\n    seen = set()\n    out = []\n    for x in xs:\n"
        "        if x not in seen:\n"
        "            seen.add(x)\n            out.append(x)\n    return out\n",
        [([rng.randint(0, 5) for _ in range(10)],), (list("mississippi"),)],
    )


def _t_gcd(rng):
    return Function(
        "gcd",
        "(a: int, b: int) -> int",
        "return the greatest common divisor of the non-negative integers `a` and `b` "
        "(gcd(0, 0) == 0).",
        "def gcd(a, b):\n    while b:\n        a, b = b, a % b\n    return a\n",
        [(rng.randint(10, 200) * 6, rng.randint(10, 200) * 4), (0, rng.randint(1, 50))],
    )


def _t_primes(rng):
    return Function(
        "primes_below",
        "(n: int) -> list[int]",
        "return all prime numbers smaller than `n`, in increasing order.",
        "def primes_below(n):\n"
        "    return [p for p in range(2, n) if all(p % d for d in range(2, int(p ** 0.5) + 1))]\n",
        [(rng.randint(10, 60),), (2,)],
    )


def _t_running(rng):
    return Function(
        "running_sum",
        "(xs: list[int]) -> list[int]",
        "return the list of prefix sums of `xs` (element i is the sum of xs[0..i]).",
        "def running_sum(xs):\n    out = []\n    total = 0\n    for x in xs:\n        total += x\n"
        "        out.append(total)\n    return out\n",
        [([rng.randint(-9, 9) for _ in range(6)],), ([],)],
    )


def _t_slug(rng):
    return Function(
        "slugify",
        "(s: str) -> str",
        'lowercase `s`, replace every run of characters that are not a-z or 0-9 by one "-", '
        'and strip "-" from both ends.',
        "import re\n\n\ndef slugify(s):\n"
        "    return re.sub(r'[^a-z0-9]+', '-', s.lower()).strip('-')\n",
        [("Hello, World!",), ("  Ultra--Long  Horizon 2026 ",)],
    )


def _t_kv(rng):
    sep = rng.choice([";", ",", "|"])
    return Function(
        "parse_pairs",
        "(s: str) -> dict[str, str]",
        f'parse a string like "a=1{sep}b=2" into {{"a": "1", "b": "2"}}: pairs are separated by '
        f'"{sep}", key and value by the first "=", surrounding spaces are stripped, '
        "empty pairs ignored.",
        f"def parse_pairs(s):\n    out = {{}}\n    for part in s.split({sep!r}):\n"
        "        if not part.strip():\n"
        "            continue\n        k, v = part.split('=', 1)\n"
        "        out[k.strip()] = v.strip()\n    return out\n",
        [(f"x=1{sep} y = two {sep}",), (f"k=v=w{sep}{sep}a=b",)],
    )


def _t_transpose(rng):
    return Function(
        "transpose",
        "(m: list[list]) -> list[list]",
        "return the transpose of the rectangular matrix `m` given as a list of rows.",
        "def transpose(m):\n    return [list(r) for r in zip(*m)]\n",
        [([[1, 2, 3], [4, 5, 6]],), ([[rng.randint(0, 9)]],)],
    )


def _t_roman(rng):
    return Function(
        "to_roman",
        "(n: int) -> str",
        'return the Roman numeral of 1 <= n <= 3999 (subtractive notation, e.g. 4 -> "IV").',
        "def to_roman(n):\n"
        "    vals = [(1000, 'M'), (900, 'CM'), (500, 'D'), (400, 'CD'), (100, 'C'), (90, 'XC'),\n"
        "            (50, 'L'), (40, 'XL'), (10, 'X'), (9, 'IX'), (5, 'V'), (4, 'IV'), (1, 'I')]\n"
        "    out = ''\n    for v, s in vals:\n        while n >= v:\n            out += s\n"
        "            n -= v\n    return out\n",
        [(rng.randint(1, 50),), (rng.randint(1000, 3999),)],
    )


def _t_digits(rng):
    return Function(
        "digit_sum",
        "(n: int) -> int",
        "return the sum of the decimal digits of the integer `n` (the sign is ignored).",
        "def digit_sum(n):\n    return sum(int(c) for c in str(abs(n)))\n",
        [(rng.randint(1000, 99999),), (-rng.randint(10, 99),)],
    )


def _t_fib(rng):
    a, b = rng.choice([(0, 1), (2, 1), (1, 3)])
    return Function(
        "seq_term",
        "(n: int) -> int",
        f"return term n (n >= 0) of the sequence t0 = {a}, t1 = {b}, t(n) = t(n-1) + t(n-2).",
        f"def seq_term(n):\n    x, y = {a}, {b}\n    for _ in range(n):\n"
        "        x, y = y, x + y\n    return x\n",
        [(rng.randint(0, 3),), (rng.randint(10, 25),)],
    )


def _t_median(rng):
    return Function(
        "median",
        "(xs: list[float]) -> float",
        "return the median of the non-empty list `xs` (the mean of the two middle values when "
        "the length is even), as a float.",
        "def median(xs):\n    s = sorted(xs)\n    m = len(s) // 2\n"
        "    return float(s[m]) if len(s) % 2 else (s[m - 1] + s[m]) / 2\n",
        [([rng.randint(0, 20) for _ in range(5)],), ([rng.randint(0, 20) for _ in range(4)],)],
    )


def _t_longer(rng):
    n = rng.randint(3, 5)
    return Function(
        "long_words",
        "(text: str) -> list[str]",
        f"return the words of `text` (split on whitespace) longer than {n} characters, in order.",
        f"def long_words(text):\n    return [w for w in text.split() if len(w) > {n}]\n",
        [("an agent trains on extremely long executions",), ("tiny",)],
    )


def _t_rotate(rng):
    k = rng.randint(1, 3)
    return Function(
        "rotate",
        "(xs: list) -> list",
        f"return `xs` rotated left by {k} places (item {k} comes first); an empty list stays empty "
        f"and the rotation wraps around for short lists.",
        f"def rotate(xs):\n    if not xs:\n        return []\n    k = {k} % len(xs)\n"
        "    return xs[k:] + xs[:k]\n",
        [(list(range(6)),), (["a", "b"],)],
    )


def _t_vowel_first(rng):
    return Function(
        "initials",
        "(name: str) -> str",
        "return the upper-case first letters of the space-separated words of `name`, joined with "
        'dots and ending with a dot, e.g. "ada lovelace" -> "A.L.".',
        "def initials(name):\n    return ''.join(w[0].upper() + '.' for w in name.split())\n",
        [("grace brewster hopper",), ("alan",)],
    )


def _t_bin(rng):
    width = rng.choice([4, 8])
    return Function(
        "to_bits",
        "(n: int) -> str",
        f"return the binary representation of 0 <= n < 2**{width} as exactly {width} "
        "characters of 0 and 1.",
        f"def to_bits(n):\n    return format(n, '0{width}b')\n",
        [(rng.randint(0, 2**width - 1),), (0,)],
    )


_TEMPLATES = [
    _t_add,
    _t_clamp,
    _t_vowels,
    _t_palindrome,
    _t_fizz,
    _t_rle,
    _t_caesar,
    _t_freq,
    _t_flatten,
    _t_chunk,
    _t_dedupe,
    _t_gcd,
    _t_primes,
    _t_running,
    _t_slug,
    _t_kv,
    _t_transpose,
    _t_roman,
    _t_digits,
    _t_fib,
    _t_median,
    _t_longer,
    _t_rotate,
    _t_vowel_first,
    _t_bin,
]

_ADJ = [
    "tiny",
    "swift",
    "calm",
    "bold",
    "amber",
    "lunar",
    "misty",
    "quick",
    "brave",
    "noble",
    "solar",
    "vivid",
]
_NOUN = [
    "otter",
    "falcon",
    "maple",
    "harbor",
    "comet",
    "ember",
    "willow",
    "canyon",
    "heron",
    "quartz",
    "meadow",
]
_MODULES = [
    "core",
    "text",
    "numbers",
    "lists",
    "utils",
    "convert",
    "parse",
    "maths",
    "seqs",
    "strings",
]


def _expected(fn: Function, args: tuple):
    ns: dict = {}
    exec(fn.code, ns)  # noqa: S102 - our own reference implementation
    return ns[fn.name](*args)


@dataclass
class _Module:
    name: str
    functions: list[Function]

    def code(self) -> str:
        imports = sorted(
            {
                line
                for f in self.functions
                for line in f.code.splitlines()
                if line.startswith("import ")
            }
        )
        bodies = [
            "\n".join(line for line in f.code.splitlines() if not line.startswith("import ")).strip(
                "\n"
            )
            for f in self.functions
        ]
        head = "\n".join(imports) + "\n\n\n" if imports else ""
        return (
            f'"""{self.name}: generated reference solution."""\n\n'
            + head
            + "\n\n\n".join(bodies)
            + "\n"
        )

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
                out += [
                    "",
                    f"def test_{f.name}_{i}():",
                    f"    from {pkg}.{self.name} import {f.name}",
                    f"    assert {call} == {expected!r}",
                    "",
                ]
                n += 1
        return "\n".join(out).rstrip() + "\n", n


def _package(rng: random.Random, num_functions: int, per_module: int) -> tuple[str, list[_Module]]:
    pkg = f"{rng.choice(_ADJ)}_{rng.choice(_NOUN)}"
    templates = rng.sample(_TEMPLATES, num_functions)
    functions = [t(rng) for t in templates]
    names = rng.sample(_MODULES, (num_functions + per_module - 1) // per_module)
    modules = [
        _Module(name, functions[i * per_module : (i + 1) * per_module])
        for i, name in enumerate(names)
    ]
    return pkg, modules


def nl2repo_task(index: int, seed: int, suite: str, multiagent: bool) -> TaskFiles:
    rng = random.Random(f"{seed}:{suite}:{index}")
    if multiagent:
        difficulty = 2 + index % 3  # 2..4 modules of 2 functions
        pkg, modules = _package(rng, 2 * difficulty, 2)
    else:
        difficulty = 1 + index % 5  # 2..6 functions in modules of up to 2
        pkg, modules = _package(rng, difficulty + 1, 2)
    tests: dict[str, str] = {}
    total = 0
    steps = [
        Step(
            tool="write_file",
            arguments={"path": f"{pkg}/__init__.py", "content": f'"""{pkg}."""\n'},
            tests_passing=0,
        )
    ]
    sub_agents: dict[str, list[Step]] = {}
    for m in modules:
        text, n = m.tests(pkg)
        tests[f"test_{m.name}.py"] = text
        total += n
        write = Step(
            tool="write_file", arguments={"path": f"{pkg}/{m.name}.py", "content": m.code()}
        )
        if multiagent:
            sub_task = (
                f"In the Python package `{pkg}` (the folder `{pkg}/` in the workspace), "
                "write this module:\n\n"
                + m.spec(pkg)
                + "\n\nWrite only this module, then call finish."
            )
            sub_agents[sub_task] = [write]
            steps.append(Step(tool="delegate", arguments={"task": sub_task}, tests_passing=total))
        else:
            steps.append(Step(tool=write.tool, arguments=write.arguments, tests_passing=total))
    body = "\n\n".join(m.spec(pkg) for m in modules)
    intro = (
        f"# Build the Python package `{pkg}`\n\n"
        f"Create the package `{pkg}` in the workspace: a folder `{pkg}/` with an `__init__.py` "
        "and the modules below. Hidden tests import each function from its module and check it "
        "on examples.\n\n"
    )
    if multiagent:
        intro += (
            f"The {len(modules)} modules are independent. Delegate each module to a sub-agent "
            "with the "
            "`delegate` tool, passing its full specification, and write `__init__.py` yourself.\n\n"
        )
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
