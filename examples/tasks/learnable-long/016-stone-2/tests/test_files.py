"""Hidden tests (generated): one per file, so the score is the share of files right."""


def test_file_0():
    import os
    assert os.path.isfile('a.txt') and open('a.txt').read().strip() == 'stone'


def test_file_1():
    import os
    assert os.path.isfile('answer.txt') and open('answer.txt').read().strip() == 'ocean'


def test_file_2():
    import os
    assert os.path.isfile('out.txt') and open('out.txt').read().strip() == 'sugar'


def test_file_3():
    import os
    assert os.path.isfile('data.txt') and open('data.txt').read().strip() == 'house'
