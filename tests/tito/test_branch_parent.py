"""Which earlier call a branch hangs from: an agent's compaction asks for a summary without tools,
then restarts with its tools. The restart must hang from a call that had the same tools (it shares
the system turn, the tools and the task with it), not from the summary call, which shares only the
system text (the tools render inside the system turn)."""

from __future__ import annotations

import httpx
import pytest

from gyre.trajectory import build_tree
from tests.tito.conftest import make_proxy, serving
from tests.tito.test_heal import SYSTEM, TOOLS, USER, engine_for, message, tool_result

pytestmark = pytest.mark.anyio

CALL = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
SUMMARY = "I called add(2, 3) and got 5."


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


async def test_a_restart_after_compaction_hangs_from_a_call_with_its_tools(tok, anyio_backend):
    proxy = make_proxy(tok, engine_for(tok, CALL, SUMMARY, "ok"))
    key = proxy.mint_key("e")
    compact = {"role": "user", "content": "Summarize your progress."}
    async with serving(proxy) as base, httpx.AsyncClient(base_url=base) as http:

        async def send(messages: list[dict], tools: list[dict] | None) -> dict:
            body = {"model": "gyre", "messages": messages}
            if tools is not None:
                body["tools"] = tools
            r = await http.post(
                "/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
            )
            assert r.status_code == 200, r.text
            return r.json()

        r0 = await send([SYSTEM, USER], TOOLS)
        await send([SYSTEM, USER, message(r0), tool_result(r0), compact], None)  # the summary
        restart = {"role": "user", "content": f"{USER['content']}\n\nProgress so far:\n{SUMMARY}"}
        await send([SYSTEM, restart], TOOLS)
    c0, c1, c2 = proxy.calls("e", full=True)
    assert (c1.parent_call_id, c1.divergence.reason) == ("c0", "tools_changed")
    # The restart: from c0 (same tools), as a compaction; it shares c0's system turn, tools and
    # task text. The summary call c1 shares far less with it.
    assert (c2.parent_call_id, c2.divergence.reason) == ("c0", "compaction")
    with_c0 = common_prefix(c0.prompt_ids + c0.completion_ids, c2.prompt_ids)
    with_c1 = common_prefix(c1.prompt_ids + c1.completion_ids, c2.prompt_ids)
    assert c2.divergence.index == with_c0 and with_c0 > with_c1 + 20
    # The tree stores the shared prefix once: c2 adds only the tokens after it.
    stats = build_tree(proxy.calls("e")).statistics()
    total = sum(len(c.prompt_ids) + len(c.completion_ids) for c in (c0, c1, c2))
    unique = (
        len(c0.prompt_ids) + len(c0.completion_ids)
        + len(c1.prompt_ids) + len(c1.completion_ids) - c1.divergence.index
        + len(c2.prompt_ids) + len(c2.completion_ids) - with_c0
    )  # fmt: skip
    assert (stats.tokens_in_calls, stats.unique_tokens) == (total, unique)
