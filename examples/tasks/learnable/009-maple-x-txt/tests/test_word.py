"""Hidden tests (generated)."""


def test_file_exists():
    import os
    assert os.path.isfile('x.txt')


def test_word():
    assert open('x.txt').read().strip() == 'maple'
