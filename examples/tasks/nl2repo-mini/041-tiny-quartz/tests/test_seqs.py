"""Hidden tests (generated)."""


def test_fizzbuzz_0():
    from tiny_quartz.seqs import fizzbuzz
    assert fizzbuzz(9) == ['1', 'Ping', '3', 'Ping', '5', 'Ping', 'Pong', 'Ping', '9']


def test_fizzbuzz_1():
    from tiny_quartz.seqs import fizzbuzz
    assert fizzbuzz(17) == ['1', 'Ping', '3', 'Ping', '5', 'Ping', 'Pong', 'Ping', '9', 'Ping', '11', 'Ping', '13', 'PingPong', '15', 'Ping', '17']
