"""A test agent: two model calls through the proxy (the second extends the first), then it solves
its `learnable` task when its group slot (`...-g<slot>` in its execution id) is odd, so every
group has rewards 0 and 1.

Run by the harness as `python coin_agent.py [--linger-even S]` with OPENAI_BASE_URL,
OPENAI_API_KEY, GYRE_EXECUTION_ID and GYRE_INSTRUCTION_FILE set, in its workspace. With
`--linger-even S`, even group slots wait S seconds after their last call before they end, so a
group's odd member finishes well before its even one.
"""

import argparse
import os
import re
import sys
import time
from pathlib import Path

import openai


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--linger-even", type=float, default=0.0)
    linger_even = parser.parse_args().linger_even
    instruction = Path(os.environ["GYRE_INSTRUCTION_FILE"]).read_text()
    word, path = re.search(r"Write the word (\S+) to the file (\S+)\.", instruction).groups()
    client = openai.OpenAI(max_retries=0)
    messages = [{"role": "user", "content": instruction}]
    for _ in range(2):
        reply = client.chat.completions.create(
            model=os.environ.get("GYRE_MODEL", "gyre"), messages=messages, max_tokens=12
        )
        messages += [
            {"role": "assistant", "content": reply.choices[0].message.content or ""},
            {"role": "user", "content": "go on"},
        ]
    if int(os.environ["GYRE_EXECUTION_ID"].rsplit("-g", 1)[1]) % 2:  # odd group slots solve it
        Path(path).write_text(word)
    else:
        time.sleep(linger_even)
    return 0


if __name__ == "__main__":
    sys.exit(main())
