"""Hidden tests (generated): one per file, so the score is the share of files right."""


def test_file_0():
    import os
    assert os.path.isfile('word.txt') and open('word.txt').read().strip() == 'stone'


def test_file_1():
    import os
    assert os.path.isfile('data.txt') and open('data.txt').read().strip() == 'music'


def test_file_2():
    import os
    assert os.path.isfile('x.txt') and open('x.txt').read().strip() == 'tiger'


def test_file_3():
    import os
    assert os.path.isfile('a.txt') and open('a.txt').read().strip() == 'cloud'
