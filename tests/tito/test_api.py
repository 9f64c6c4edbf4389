"""The public API of gyre.tito is what its `__all__` says (docs/style.md rule 1)."""

from __future__ import annotations

import gyre.tito


def test_tito_all_names_exist_and_public_names_are_listed() -> None:
    exported = set(gyre.tito.__all__)
    assert all(hasattr(gyre.tito, n) for n in exported)
    public = {
        n
        for n, v in vars(gyre.tito).items()
        if not n.startswith("_")
        and not isinstance(v, type(gyre.tito))
        and getattr(v, "__module__", "").startswith("gyre")
    }
    assert public <= exported, f"gyre.tito exposes {sorted(public - exported)} outside __all__"
    assert {"TitoProxy", "ModelCall", "read_log"} <= exported
