"""Hidden tests (generated)."""


def test_to_bits_0():
    from noble_heron.text import to_bits
    assert to_bits(9) == '1001'


def test_to_bits_1():
    from noble_heron.text import to_bits
    assert to_bits(0) == '0000'


def test_parse_pairs_0():
    from noble_heron.text import parse_pairs
    assert parse_pairs('x=1, y = two ,') == {'x': '1', 'y': 'two'}


def test_parse_pairs_1():
    from noble_heron.text import parse_pairs
    assert parse_pairs('k=v=w,,a=b') == {'k': 'v=w', 'a': 'b'}
