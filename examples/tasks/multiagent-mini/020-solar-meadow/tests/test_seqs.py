"""Hidden tests (generated)."""


def test_to_bits_0():
    from solar_meadow.seqs import to_bits
    assert to_bits(1) == '0001'


def test_to_bits_1():
    from solar_meadow.seqs import to_bits
    assert to_bits(0) == '0000'


def test_seq_term_0():
    from solar_meadow.seqs import seq_term
    assert seq_term(0) == 1


def test_seq_term_1():
    from solar_meadow.seqs import seq_term
    assert seq_term(23) == 103682
