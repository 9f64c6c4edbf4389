"""Several hosts under one head node (`gyre.cell.join`, `python -m gyre.node --join`).

Fast: the head's join endpoint refuses a wrong secret on both sides (the worker's `ConfigError`
carries the head's 401 message; the head counts the refusal), and a gloo gradient group whose
device is chosen by `local_address_for` moves a tensor between two ranks exactly.

Slow (root, network namespaces; skipped with the reason elsewhere): a head and two workers, each
in a namespace of its own with its own address (`tests/runtime/netns_hosts.py`), run a real
3-step elastic run (scripted cells with DeepSpeed trainers on the tiny model, one gloo group over
the hosts); one worker is killed with SIGKILL once step 2 is written (mid-step 3). The run goes
on: 3 steps, 0 executions lost, 0 model calls duplicated (the call log against the replies the
agents printed), every step trained on its whole batch once; and a worker with a wrong secret is
refused with a clear line on both sides.
"""

from __future__ import annotations

import threading
from pathlib import Path

import anyio
import httpx
import pytest
import torch

from gyre.cell.grad_group import GradientGroup, host_group_store, local_address_for
from gyre.cell.join import CellExit, _report_exit, open_join_server, run_worker
from gyre.config import config_from_dict
from gyre.errors import ConfigError


def test_a_join_with_a_wrong_or_no_secret_is_refused_on_both_sides(tmp_path: Path) -> None:
    config = config_from_dict(
        {
            "run_dir": str(tmp_path / "run"),
            "cluster": {"workers": 1, "port": 0, "secret": "right", "host": "127.0.0.1"},
        }
    )

    async def main():
        async with open_join_server(config, tmp_path / "model") as server:
            head = f"127.0.0.1:{server.port}"
            with pytest.raises(ConfigError) as wrong:
                await run_worker(head, secret="wrong")
            async with httpx.AsyncClient() as http:
                bare = await http.post(f"http://{head}/join", content=b'{"host": "x"}')
            return server.refused, server.joined, wrong.value, bare

    refused, joined, wrong, bare = anyio.run(main, backend="trio")
    assert refused == 2 and joined == 0
    assert "answered HTTP 401: join refused" in str(wrong)
    assert bare.status_code == 401 and bare.json()["error"]["code"] == "join_refused"


def test_a_worker_without_a_secret_is_refused_before_connecting(monkeypatch) -> None:
    monkeypatch.delenv("GYRE_JOIN_SECRET", raising=False)
    with pytest.raises(ConfigError, match=r"\$GYRE_JOIN_SECRET"):
        anyio.run(run_worker, "127.0.0.1:1", backend="trio")


@pytest.mark.parametrize("failures", [1, 3])
def test_a_cell_exit_report_is_tried_again_after_a_transport_error(failures: int) -> None:
    """A worker's `POST /cell_exit` that fails before the head answers (a pooled connection the
    head closed as it was reused) is sent again: after 1 failure the second try lands with the
    same body; 3 failures in 3 tries report the head gone."""
    seen: list[bytes] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.content)
        if len(seen) <= failures:
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.")
        return httpx.Response(200, json={})

    body = CellExit(worker=1, rank=2, code=-9)

    async def main() -> bool:
        transport = httpx.MockTransport(answer)
        async with httpx.AsyncClient(transport=transport, base_url="http://head") as http:
            return await _report_exit(http, body, attempts=3, pause_s=0.0)

    landed = anyio.run(main)
    expected = b'{"worker":1,"rank":2,"code":-9}'
    assert (landed, seen) == ((True, [expected] * 2) if failures == 1 else (False, [expected] * 3))


def test_gradient_group_device_on_the_route_to_the_store() -> None:
    assert local_address_for("127.0.0.1") == "127.0.0.1"
    store = host_group_store("127.0.0.1", timeout_s=30)
    address = f"127.0.0.1:{store.port}"
    groups: dict[int, GradientGroup] = {}

    def join(rank: int) -> None:
        groups[rank] = GradientGroup(address, rank, 2, timeout_s=30)

    threads = [threading.Thread(target=join, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    sent = torch.arange(6, dtype=torch.float64) / 7
    got = torch.zeros(6, dtype=torch.float64)
    receiver = threading.Thread(target=groups[0].recv, args=(got, 1))
    receiver.start()
    groups[1].send(sent, 0)
    receiver.join(30)
    assert torch.equal(got, sent)
    assert (groups[1].sent, groups[0].received) == (1, 1)


# -- several hosts in network namespaces ---------------------------------------------------------


@pytest.fixture(scope="module")
def hosts():
    from tests.runtime.netns_hosts import namespace_hosts, unavailable

    reason = unavailable()
    if reason:
        pytest.skip(reason)
    with namespace_hosts(3) as made:
        yield made


@pytest.mark.slow
def test_head_and_two_workers_survive_a_worker_killed_mid_step(hosts) -> None:
    from benchmarks.bench_multinode import cluster_run

    run, result = cluster_run(hosts, "test-multihost-kill", cells_per_host=1, kill_worker=2)
    assert result["killed_worker"] == 2, result
    assert result["exit_code"] == 0, result["what_happened"]
    assert result["worker_exit_codes"] == [0, -9]  # the survivor was told the run is done
    assert result["worker_lost_lines"] == 1
    assert result["steps_done"] == [1, 2, 3]
    assert result["executions_trained"] == 12 and result["executions_failed"] == 0
    assert result["executions_lost"] == 0
    assert result["calls_duplicated"] == 0
    assert result["executions_checked_against_agents"] >= 12
    assert result["log_torn_bytes"] == 0 and result["log_unresolved"] == 0
    # the head drove 3 cells on 3 hosts: the workers' cells bound their own namespace address
    log = run.head_log()
    for host in hosts[1:]:
        assert f"http://{host.address}:" in log


@pytest.mark.slow
def test_a_worker_with_a_wrong_secret_is_refused(hosts) -> None:
    from benchmarks.bench_multinode import wrong_secret_join

    result = wrong_secret_join(hosts)
    assert result["head_listening"]
    assert result["worker_exit_code"] == 2
    assert "join refused" in result["worker_error"] and "HTTP 401" in result["worker_error"]
    assert "refused /join from 10.200.0.2:" in result["head_refusal"]
