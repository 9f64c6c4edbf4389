"""The agent of `bench_faults.py`: a few chained model calls through the proxy, a pause between
them (so a fault lands mid-execution), then it solves its `learnable` task on odd group slots.

Each reply it receives is printed as one JSON line on stdout (`{"received": i, "id": ...,
"tokens": n}`), which the harness keeps in the execution's `stdout.log` (`keep_workspaces`), so
the sweep can compare what agents received with what the call log recorded. Run by the harness
with OPENAI_BASE_URL, OPENAI_API_KEY, GYRE_EXECUTION_ID and GYRE_INSTRUCTION_FILE set.
"""

import json
import os
import re
import sys
import time
from pathlib import Path

import openai

CALLS = int(os.environ.get("FAULT_AGENT_CALLS", "3"))
PAUSE_S = float(os.environ.get("FAULT_AGENT_PAUSE_S", "1.0"))


def main() -> int:
    instruction = Path(os.environ["GYRE_INSTRUCTION_FILE"]).read_text()
    word, path = re.search(r"Write the word (\S+) to the file (\S+)\.", instruction).groups()
    client = openai.OpenAI(max_retries=0)
    messages = [{"role": "user", "content": instruction}]
    for i in range(CALLS):
        reply = client.chat.completions.create(
            model=os.environ.get("GYRE_MODEL", "gyre"), messages=messages, max_tokens=12
        )
        tokens = reply.usage.completion_tokens if reply.usage else -1
        print(json.dumps({"received": i, "id": reply.id, "tokens": tokens}), flush=True)
        messages += [
            {"role": "assistant", "content": reply.choices[0].message.content or ""},
            {"role": "user", "content": "go on"},
        ]
        time.sleep(PAUSE_S)
    if int(os.environ["GYRE_EXECUTION_ID"].rsplit("-g", 1)[1]) % 2:  # odd group slots solve it
        Path(path).write_text(word)
    return 0


if __name__ == "__main__":
    sys.exit(main())
