"""Hidden tests (generated): one per file, so the score is the share of files right."""


def test_file_0():
    import os
    assert os.path.isfile('spec.txt') and open('spec.txt').read().strip() == 'module'


def test_file_1():
    import os
    assert os.path.isfile('name.txt') and open('name.txt').read().strip() == 'config'


def test_file_2():
    import os
    assert os.path.isfile('test.txt') and open('test.txt').read().strip() == 'number'


def test_file_3():
    import os
    assert os.path.isfile('user.txt') and open('user.txt').read().strip() == 'list'
