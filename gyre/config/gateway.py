"""Config of the gateway: executions run by agent loops outside gyre, opened and closed over HTTP.

Owns `GatewayConfig` (`[gateway]`: on or off, the address of the execution API, its admin token,
how long a claim may wait and how long an execution may stay unclaimed). Knows nothing about the
HTTP routes (`gyre.rollout.gateway`) or the file format.
"""

from __future__ import annotations

from gyre.config.base import Config, check_positive

__all__ = ["GatewayConfig"]


class GatewayConfig(Config, frozen=True):
    """The gateway (`gyre.rollout.gateway`, `python -m gyre.gateway`): bring your own agent loop.

    On, the run's executions are not started by the harness: each one is published as pending,
    an agent loop claims it over HTTP (`POST /gyre/v1/executions` on `host:port`), runs its agent
    against the TITO proxy with the key it got, posts a reward or asks for the task's verifier,
    and closes it."""

    enabled: bool = False
    """Executions come from external agent loops (`python -m gyre.gateway` turns it on); off:
    the harness runs `tasks.harness.agent_command`."""
    host: str = "127.0.0.1"
    """Address the execution API binds to."""
    port: int = 0
    """TCP port of the execution API; 0 picks a free one (written to `<run_dir>/gateway.json`)."""
    admin_token: str = ""
    """Bearer token of the execution API (not an execution's key); empty: the environment
    variable `GYRE_GATEWAY_TOKEN`, else a random one printed at start."""
    max_claim_wait_s: float = 60.0
    """Longest a claim request waits for a pending execution (its `wait_s` is capped here)."""
    claim_timeout_s: float = 3600.0
    """A pending execution no agent loop claims within this many seconds ends `failed`, so a run
    without a loop cannot stall a step forever (docs/design.md invariant 7)."""

    def __post_init__(self) -> None:
        check_positive(max_claim_wait_s=self.max_claim_wait_s, claim_timeout_s=self.claim_timeout_s)
        if not self.host:
            raise ValueError(f"host={self.host!r} must not be empty")
        if not 0 <= self.port < 65536:
            raise ValueError(f"port={self.port} must be in [0, 65535]")
