"""Hidden tests (generated)."""


def test_fizzbuzz_0():
    from amber_ember.seqs import fizzbuzz
    assert fizzbuzz(6) == ['1', '2', '3', 'Ping', '5', 'Pong']


def test_fizzbuzz_1():
    from amber_ember.seqs import fizzbuzz
    assert fizzbuzz(17) == ['1', '2', '3', 'Ping', '5', 'Pong', '7', 'Ping', '9', '10', '11', 'PingPong', '13', '14', '15', 'Ping', '17']


def test_rotate_0():
    from amber_ember.seqs import rotate
    assert rotate([0, 1, 2, 3, 4, 5]) == [2, 3, 4, 5, 0, 1]


def test_rotate_1():
    from amber_ember.seqs import rotate
    assert rotate(['a', 'b']) == ['a', 'b']
