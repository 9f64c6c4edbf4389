"""gyre.cell (see docs/design.md): a cell's worker process and the node's one client of it.

The worker (`server`, on asyncio + aiohttp: `python -m gyre.cell.server`) serves an engine and a
trainer over HTTP: its routes (`api`), role switches and training (`roles`, `ranks`), token
streams (`stream`), all in the wire format of `wire`. The node side (anyio + httpx) spawns cells
(`spawn`), joins other hosts" cells (`join`), and drives each through a `CellClient` (`client`,
`inbox`). `grad_group` is the gloo group the gradients cross.
"""

from __future__ import annotations

import typing

from gyre._lazy import lazy_exports as _lazy_exports

if typing.TYPE_CHECKING:
    from gyre.cell.client import CellClient
    from gyre.cell.spawn import CellProcess, open_cell, open_cells
    from gyre.cell.wire import CellRole

__all__ = ["CellClient", "CellProcess", "CellRole", "open_cell", "open_cells"]

__getattr__, __dir__ = _lazy_exports(
    __name__,
    {
        **dict.fromkeys(["CellClient"], "gyre.cell.client"),
        **dict.fromkeys(["CellProcess", "open_cell", "open_cells"], "gyre.cell.spawn"),
        **dict.fromkeys(["CellRole"], "gyre.cell.wire"),
    },
)
