"""Hidden tests (generated)."""


def test_to_bits_0():
    from brave_canyon.text import to_bits
    assert to_bits(146) == '10010010'


def test_to_bits_1():
    from brave_canyon.text import to_bits
    assert to_bits(0) == '00000000'


def test_parse_pairs_0():
    from brave_canyon.text import parse_pairs
    assert parse_pairs('x=1| y = two |') == {'x': '1', 'y': 'two'}


def test_parse_pairs_1():
    from brave_canyon.text import parse_pairs
    assert parse_pairs('k=v=w||a=b') == {'k': 'v=w', 'a': 'b'}
