"""Hidden tests (generated)."""


def test_file_exists():
    import os
    assert os.path.isfile('data.txt')


def test_word():
    assert open('data.txt').read().strip() == 'tiger'
