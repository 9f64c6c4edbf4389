"""Hidden tests (generated)."""


def test_fizzbuzz_0():
    from vivid_ember.utils import fizzbuzz
    assert fizzbuzz(6) == ['1', '2', '3', 'Ping', '5', 'Pong']


def test_fizzbuzz_1():
    from vivid_ember.utils import fizzbuzz
    assert fizzbuzz(21) == ['1', '2', '3', 'Ping', '5', 'Pong', '7', 'Ping', '9', '10', '11', 'PingPong', '13', '14', '15', 'Ping', '17', 'Pong', '19', 'Ping', '21']


def test_transpose_0():
    from vivid_ember.utils import transpose
    assert transpose([[1, 2, 3], [4, 5, 6]]) == [[1, 4], [2, 5], [3, 6]]


def test_transpose_1():
    from vivid_ember.utils import transpose
    assert transpose([[2]]) == [[2]]
