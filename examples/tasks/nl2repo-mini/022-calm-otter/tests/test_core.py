"""Hidden tests (generated)."""


def test_transpose_0():
    from calm_otter.core import transpose
    assert transpose([[1, 2, 3], [4, 5, 6]]) == [[1, 4], [2, 5], [3, 6]]


def test_transpose_1():
    from calm_otter.core import transpose
    assert transpose([[3]]) == [[3]]


def test_fizzbuzz_0():
    from calm_otter.core import fizzbuzz
    assert fizzbuzz(5) == ['1', '2', 'Ping', '4', 'Pong']


def test_fizzbuzz_1():
    from calm_otter.core import fizzbuzz
    assert fizzbuzz(27) == ['1', '2', 'Ping', '4', 'Pong', 'Ping', '7', '8', 'Ping', 'Pong', '11', 'Ping', '13', '14', 'PingPong', '16', '17', 'Ping', '19', 'Pong', 'Ping', '22', '23', 'Ping', 'Pong', '26', 'Ping']
