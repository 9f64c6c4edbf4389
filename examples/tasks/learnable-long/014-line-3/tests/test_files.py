"""Hidden tests (generated): one per file, so the score is the share of files right."""


def test_file_0():
    import os
    assert os.path.isfile('input.txt') and open('input.txt').read().strip() == 'line'


def test_file_1():
    import os
    assert os.path.isfile('name.txt') and open('name.txt').read().strip() == 'string'


def test_file_2():
    import os
    assert os.path.isfile('user.txt') and open('user.txt').read().strip() == 'key'


def test_file_3():
    import os
    assert os.path.isfile('test.txt') and open('test.txt').read().strip() == 'number'
