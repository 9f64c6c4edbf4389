"""Agents in a sealed network namespace (`tasks.harness.isolate_network`): only the proxy answers.

An agent run by the harness tries every listening TCP port of the node (from the node's
/proc/net/tcp and tcp6, a gloo TCPStore among them) and every unix socket of the node (path and
abstract, from /proc/net/unix, one planted where the agent's namespace shows it); sealed, it
reaches the TITO proxy alone, through an unmodified `OPENAI_BASE_URL`. The same probe without the
seal reaches them, so the sweep is not vacuous. The reference agent still finishes a task through
the proxy while sealed. Needs root with CAP_SYS_ADMIN (as here and in CI); skipped elsewhere.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import shutil
import socket
import sys
import tempfile
from pathlib import Path

import anyio
import pytest

from gyre.agents.control import ExecutionControl
from gyre.agents.harness import Harness
from gyre.agents.isolation import node_sockets, sealed_endpoint
from gyre.config import HarnessConfig, ProxyConfig
from gyre.engines.scripted import ScriptedEngine, ScriptedReply
from gyre.sandbox import Relay, mount_namespace_problem, network_namespace_problem
from gyre.tasks.solution import load_solution
from gyre.tasks.task import load_suite, load_task
from tests.tasks.test_task import make_task

ROOT_OK = os.geteuid() == 0 and mount_namespace_problem() is None
NETNS_OK = ROOT_OK and network_namespace_problem() is None
needs_netns = pytest.mark.skipif(
    not NETNS_OK, reason=f"needs root with CAP_SYS_ADMIN: {network_namespace_problem()}"
)

UID_BASE = 330_000

# Run by the harness as the agent: tries every target, then asks the proxy through its URL.
PROBE = """
import json, os, socket, sys, urllib.request
targets = json.loads(sys.argv[1])
reached = []
for host, port in targets["tcp"]:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.settimeout(3)
            s.connect((host, port))
            reached.append(f"tcp {host} {port}")
    except OSError:
        pass
for path in targets["unix"]:
    address = "\\0" + path[1:] if path.startswith("@") else path
    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM, socket.SOCK_SEQPACKET):
        try:
            with socket.socket(socket.AF_UNIX, kind) as s:
                s.settimeout(3)
                s.connect(address)
                reached.append(f"unix {path}")
                break
        except OSError:
            pass
body = {"model": os.environ["GYRE_MODEL"], "messages": [{"role": "user", "content": "hi"}]}
request = urllib.request.Request(
    os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=json.dumps(body).encode(),
    headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
             "Content-Type": "application/json"})
reply = json.load(urllib.request.urlopen(request, timeout=60))
print(json.dumps({"reached": reached, "tried": len(targets["tcp"]) + len(targets["unix"]),
                  "url": os.environ["OPENAI_BASE_URL"],
                  "reply": reply["choices"][0]["message"]["content"]}))
"""


def _address(hex_ip: str) -> str:
    raw = bytes.fromhex(hex_ip)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))  # four host-order words
    return socket.inet_ntop(socket.AF_INET6, words)


def node_addresses() -> set[str]:
    """The node's own addresses: IPv4 (LOCAL host routes of /proc/net/fib_trie) and IPv6 but
    link-local ones (/proc/net/if_inet6)."""
    lines = Path("/proc/net/fib_trie").read_text().splitlines()
    v4 = {
        lines[i - 1].split()[-1]
        for i, line in enumerate(lines)
        if line.strip() == "/32 host LOCAL" and i > 0
    }
    inet6 = Path("/proc/net/if_inet6")
    v6 = {
        socket.inet_ntop(socket.AF_INET6, bytes.fromhex(line.split()[0]))
        for line in (inet6.read_text().splitlines() if inet6.exists() else ())
    }
    return v4 | {a for a in v6 if not a.startswith("fe80")}


def listening_tcp() -> set[tuple[str, int]]:
    """Every (address, port) a TCP listener of the node's namespace answers on: a wildcard
    listener on loopback and each of the node's addresses, the rest on their own address."""
    ours = node_addresses()
    out: set[tuple[str, int]] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A":  # TCP_LISTEN
                continue
            hex_ip, hex_port = fields[1].split(":")
            host, port = _address(hex_ip), int(hex_port, 16)
            if host == "0.0.0.0":
                out |= {(h, port) for h in {"127.0.0.1", *ours} if ":" not in h}
            elif host == "::":
                out |= {(h, port) for h in {"127.0.0.1", "::1", *ours}}
            else:
                out.add((host.removeprefix("::ffff:"), port))
    return out


def unix_sockets() -> set[str]:
    """Every unix socket name bound in the node's namespace: paths and abstract ('@...')."""
    lines = Path("/proc/net/unix").read_text(errors="replace").splitlines()[1:]
    names = {f[7] for line in lines if len(f := line.split(maxsplit=7)) == 8}
    return {n for n in names if n.startswith(("/", "@")) and "\x00" not in n}


@pytest.fixture
def run_dir():
    """A run folder other users may pass through (agents run as their own uids)."""
    path = Path(tempfile.mkdtemp(prefix="gyre-net-", dir="/tmp"))
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def anyio_backend() -> str:
    return "trio"


def test_sealed_endpoint_keeps_a_loopback_url_and_relays_to_the_proxy() -> None:
    relay, url = sealed_endpoint("http://127.0.0.1:8123/v1")
    assert url == "http://127.0.0.1:8123/v1"
    assert relay == Relay(listen=(("127.0.0.1", 8123),), target=("127.0.0.1", 8123))
    relay, url = sealed_endpoint("http://localhost:9/v1")
    assert (url, relay.listen, relay.target) == (
        "http://localhost:9/v1",
        (("127.0.0.1", 9),),
        ("localhost", 9),
    )
    relay, url = sealed_endpoint("http://[::1]:5/v1")
    assert (url, relay.listen, relay.target) == ("http://[::1]:5/v1", (("::1", 5),), ("::1", 5))
    # a proxy bound to every address or another host: the agent gets loopback inside
    relay, url = sealed_endpoint("http://0.0.0.0:7000/v1")
    assert (url, relay.listen, relay.target) == (
        "http://127.0.0.1:7000/v1",
        (("127.0.0.1", 7000),),
        ("127.0.0.1", 7000),
    )
    relay, url = sealed_endpoint("http://head-node:80/v1")
    assert (url, relay.target) == ("http://127.0.0.1:80/v1", ("head-node", 80))
    for bad in ("unix:///run/proxy.sock", "http:///v1"):
        with pytest.raises(ValueError, match="must be an http"):
            sealed_endpoint(bad)
    with pytest.raises(ValueError, match="loopback IP"):
        Relay(listen=(("10.0.0.1", 80),), target=("127.0.0.1", 80))
    with pytest.raises(ValueError, match="port 1-65535"):
        Relay(listen=(("127.0.0.1", 0),), target=("127.0.0.1", 80))


def test_config_requires_the_network_seal_with_require_isolation() -> None:
    from gyre.config import config_from_dict
    from gyre.errors import ConfigError

    assert HarnessConfig().isolate_network is True and HarnessConfig().require_isolation is True
    for harness in (
        {"isolate_network": False},
        {"require_isolation": True, "isolate_network": False},
    ):
        with pytest.raises(
            ConfigError,
            match=r"isolate_network=false needs require_isolation=false too: .* set "
            r"require_isolation = false to run agents unisolated "
            r"- at `\$.tasks.harness.isolate_network`",
        ):
            config_from_dict({"tasks": {"harness": harness}})
    relaxed = config_from_dict(
        {"tasks": {"harness": {"require_isolation": False, "isolate_network": False}}}
    )
    assert (relaxed.tasks.harness.isolate_network, relaxed.tasks.harness.isolate_uid) == (
        False,
        True,
    )


@needs_netns
def test_node_sockets_lists_a_planted_socket() -> None:
    path = f"/run/gyre-sock-{secrets.token_hex(4)}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(path)
        s.listen()
        try:
            assert path in node_sockets()
        finally:
            os.unlink(path)
    assert path not in node_sockets()


@pytest.mark.slow
@needs_netns
@pytest.mark.anyio
async def test_a_sealed_agent_reaches_the_proxy_and_nothing_else(run_dir: Path) -> None:
    pytest.importorskip("tokenizers")
    import torch.distributed as dist

    from gyre.model.recipe import build_tokenizer
    from gyre.tito.proxy import TitoProxy

    tok = build_tokenizer()
    reply = ScriptedReply(
        token_ids=tok.encode("only the proxy", add_special_tokens=False) + [tok.eos_token_id]
    )
    engine = ScriptedEngine(
        [reply, reply], eos_token_id=tok.eos_token_id, max_model_len=4096, vocab_size=len(tok)
    )
    proxy = TitoProxy(tokenizer=tok, engine_for=lambda _e: engine, config=ProxyConfig())
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    planted = f"/var/lib/gyre-net-{secrets.token_hex(4)}.sock"  # /var/lib is shown to agents
    abstract = f"gyre-net-{secrets.token_hex(4)}"
    # bound by a relative path in /run: /proc/net/unix names it without its folder, so
    # `node_sockets` cannot cover it; /run is private to agents (found by a tester)
    relative = f"gyre-rel-{secrets.token_hex(4)}.sock"
    path_sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    abstract_sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    relative_sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    task = load_task(make_task(run_dir / "suite" / "t", toml="[agent]\ndeadline_s = 120.0\n"))
    seen: dict[bool, dict] = {}
    try:
        path_sock.bind(planted)
        os.chmod(planted, 0o777)  # its mode lets any uid in: only the namespace keeps it away
        path_sock.listen()
        abstract_sock.bind("\0" + abstract)
        abstract_sock.listen()
        cwd = os.getcwd()
        os.chdir("/run")
        try:
            relative_sock.bind(relative)
        finally:
            os.chdir(cwd)
        os.chmod(f"/run/{relative}", 0o777)
        relative_sock.listen()
        async with anyio.create_task_group() as tg:
            port = await tg.start(proxy.serve)
            targets = {"tcp": sorted(listening_tcp()), "unix": sorted(unix_sockets())}
            assert f"/run/{relative}" not in node_sockets()  # no list of them covers it
            targets["unix"].append(f"/run/{relative}")  # where it is, for the probe
            assert ("127.0.0.1", port) in targets["tcp"]
            assert any(p == store.port for _h, p in targets["tcp"])
            assert planted in targets["unix"] and f"@{abstract}" in targets["unix"]
            for sealed in (True, False):
                config = HarnessConfig(
                    agent_uid_base=UID_BASE,
                    agent_uid_count=64,
                    kill_grace_s=0.5,
                    isolate_network=sealed,
                    require_isolation=sealed,
                )
                harness = Harness.from_config(
                    config,
                    base_url=f"http://127.0.0.1:{port}/v1",
                    run_dir=run_dir / f"run-{sealed}",
                )
                eid = f"net-{sealed}".lower()
                key = proxy.mint_key(eid)
                outcome = await harness.run(
                    task,
                    eid,
                    api_key=key,
                    agent_command=[sys.executable, "-I", "-c", PROBE, json.dumps(targets)],
                )
                assert harness.statistics().isolated == 1
                assert harness.statistics().sealed == int(sealed)
                seen[sealed] = json.loads(outcome.stdout_tail.strip().splitlines()[-1])
            tg.cancel_scope.cancel()
    finally:
        path_sock.close()
        abstract_sock.close()
        relative_sock.close()
        for path in (planted, f"/run/{relative}"):
            if os.path.exists(path):
                os.unlink(path)
    sealed, open_ = seen[True], seen[False]
    assert sealed["tried"] == len(targets["tcp"]) + len(targets["unix"]) >= 4
    # sealed: the proxy's own port, relayed, and nothing else of the node
    assert sealed["reached"] == [f"tcp 127.0.0.1 {port}"]
    assert sealed["url"] == f"http://127.0.0.1:{port}/v1"  # unmodified
    assert sealed["reply"] == open_["reply"] == "only the proxy"  # a real proxy response
    # without the seal the same sweep reaches the store, other ports and the planted sockets
    assert any(r.startswith("tcp ") and r.endswith(f" {store.port}") for r in open_["reached"])
    assert {f"unix {planted}", f"unix @{abstract}"} <= set(open_["reached"])
    # /run is private with or without the seal (the mount namespace's): never reached
    assert f"unix /run/{relative}" not in open_["reached"]
    assert len(open_["reached"]) > 3


@pytest.mark.slow
@needs_netns
@pytest.mark.anyio
async def test_reference_agent_finishes_a_task_through_the_proxy_while_sealed(
    run_dir: Path,
) -> None:
    """test_e2e_proxy's setup (scripted engine, oracle replies) with the agent sealed, under
    `require_isolation`, while a unix socket of the node is covered in the agent's and the
    verifier's namespaces."""
    pytest.importorskip("tokenizers")
    from gyre.model.recipe import build_tokenizer
    from gyre.tito.proxy import TitoProxy
    from tests.agents.test_e2e_proxy import EXAMPLES, feed_control, reply_texts

    tok = build_tokenizer()
    task = random.Random("terminal-mini").choice(load_suite(EXAMPLES / "terminal-mini"))
    script = reply_texts(load_solution(task))
    replies = [
        ScriptedReply(token_ids=tok.encode(text, add_special_tokens=False) + [tok.eos_token_id])
        for _, text in script
    ]
    engine = ScriptedEngine(
        replies, eos_token_id=tok.eos_token_id, max_model_len=65536, vocab_size=len(tok)
    )
    proxy = TitoProxy(tokenizer=tok, engine_for=lambda _e: engine, config=ProxyConfig())
    eid = "sealed-react"
    key = proxy.mint_key(eid)

    def refresh(c: ExecutionControl) -> None:
        s = proxy.summary(eid)
        c.observe_totals(
            model_calls=s.num_calls,
            completion_tokens=s.completion_tokens,
            context_refusals=s.context_refusals,
        )

    control = ExecutionControl(refresh=refresh)
    planted = f"/run/gyre-net-{secrets.token_hex(4)}.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as node_socket:
        node_socket.bind(planted)
        node_socket.listen()
        try:
            async with anyio.create_task_group() as tg:
                port = await tg.start(proxy.serve)
                config = HarnessConfig(
                    agent_uid_base=UID_BASE,
                    agent_uid_count=64,
                    kill_grace_s=0.5,
                    require_isolation=True,
                )
                harness = Harness.from_config(
                    config, base_url=f"http://127.0.0.1:{port}/v1", run_dir=run_dir
                )
                harness.hide_suite(EXAMPLES / "terminal-mini")
                tg.start_soon(feed_control, proxy, eid, control)
                outcome = await harness.run(task, eid, control=control, api_key=key)
                tg.cancel_scope.cancel()
        finally:
            os.unlink(planted)
    assert outcome.termination == "finished", outcome
    assert outcome.score.score == 1.0 and outcome.score.all_passed
    assert harness.statistics().sealed == 1 and harness.statistics().isolated == 1
    assert [c.completion_ids for c in proxy.calls(eid)] == [r.token_ids for r in replies]
