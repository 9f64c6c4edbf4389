"""Hidden tests (generated): one per file, so the score is the share of files right."""


def test_file_0():
    import os
    assert os.path.isfile('note.txt') and open('note.txt').read().strip() == 'green'


def test_file_1():
    import os
    assert os.path.isfile('word.txt') and open('word.txt').read().strip() == 'blue'


def test_file_2():
    import os
    assert os.path.isfile('answer.txt') and open('answer.txt').read().strip() == 'river'


def test_file_3():
    import os
    assert os.path.isfile('a.txt') and open('a.txt').read().strip() == 'apple'
