"""Hidden tests (generated): one per file, so the score is the share of files right."""


def test_file_0():
    import os
    assert os.path.isfile('answer.txt') and open('answer.txt').read().strip() == 'maple'


def test_file_1():
    import os
    assert os.path.isfile('x.txt') and open('x.txt').read().strip() == 'blue'


def test_file_2():
    import os
    assert os.path.isfile('b.txt') and open('b.txt').read().strip() == 'river'


def test_file_3():
    import os
    assert os.path.isfile('a.txt') and open('a.txt').read().strip() == 'pearl'
