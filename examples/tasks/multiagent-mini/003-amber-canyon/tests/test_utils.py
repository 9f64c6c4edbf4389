"""Hidden tests (generated)."""


def test_clamp_0():
    from amber_canyon.utils import clamp
    assert clamp(-18) == -13


def test_clamp_1():
    from amber_canyon.utils import clamp
    assert clamp(22) == 19


def test_seq_term_0():
    from amber_canyon.utils import seq_term
    assert seq_term(2) == 1


def test_seq_term_1():
    from amber_canyon.utils import seq_term
    assert seq_term(17) == 1597
