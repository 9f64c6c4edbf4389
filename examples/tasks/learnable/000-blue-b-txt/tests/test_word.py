"""Hidden tests (generated)."""


def test_file_exists():
    import os
    assert os.path.isfile('b.txt')


def test_word():
    assert open('b.txt').read().strip() == 'blue'
