"""Hidden tests (generated)."""


def test_fizzbuzz_0():
    from bold_willow.seqs import fizzbuzz
    assert fizzbuzz(6) == ['1', '2', '3', 'Ping', '5', 'Pong']


def test_fizzbuzz_1():
    from bold_willow.seqs import fizzbuzz
    assert fizzbuzz(23) == ['1', '2', '3', 'Ping', '5', 'Pong', '7', 'Ping', '9', '10', '11', 'PingPong', '13', '14', '15', 'Ping', '17', 'Pong', '19', 'Ping', '21', '22', '23']
