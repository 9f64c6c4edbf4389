"""A test agent: two model calls (the second extends the first), then a compaction (a third call
whose history after the instruction is replaced by a summary: the tree branches with reason
`compaction`), with a short pause between calls so a watcher sees the run go; solves its
`learnable` task in odd group slots.

Run by the harness as `python compacting_agent.py` (OPENAI_BASE_URL, OPENAI_API_KEY,
GYRE_EXECUTION_ID and GYRE_INSTRUCTION_FILE set), in its workspace.
"""

import os
import re
import sys
import time
from pathlib import Path

import openai


def main() -> int:
    instruction = Path(os.environ["GYRE_INSTRUCTION_FILE"]).read_text()
    word, path = re.search(r"Write the word (\S+) to the file (\S+)\.", instruction).groups()
    client = openai.OpenAI(max_retries=0)
    model = os.environ.get("GYRE_MODEL", "gyre")
    messages = [{"role": "user", "content": instruction}]
    for _ in range(2):
        reply = client.chat.completions.create(model=model, messages=messages, max_tokens=12)
        messages += [
            {"role": "assistant", "content": reply.choices[0].message.content or ""},
            {"role": "user", "content": "go on"},
        ]
        time.sleep(0.3)
    summary = [messages[0], {"role": "user", "content": f"Summary so far: write {word}."}]
    client.chat.completions.create(model=model, messages=summary, max_tokens=12)
    if int(os.environ["GYRE_EXECUTION_ID"].rsplit("-g", 1)[1]) % 2:
        Path(path).write_text(word)
    return 0


if __name__ == "__main__":
    sys.exit(main())
