"""Hidden tests (generated): one per file, so the score is the share of files right."""


def test_file_0():
    import os
    assert os.path.isfile('count.txt') and open('count.txt').read().strip() == 'config'


def test_file_1():
    import os
    assert os.path.isfile('main.txt') and open('main.txt').read().strip() == 'line'


def test_file_2():
    import os
    assert os.path.isfile('test.txt') and open('test.txt').read().strip() == 'package'


def test_file_3():
    import os
    assert os.path.isfile('spec.txt') and open('spec.txt').read().strip() == 'agent'
