"""Hidden tests (generated)."""


def test_file_exists():
    import os
    assert os.path.isfile('a.txt')


def test_word():
    assert open('a.txt').read().strip() == 'sugar'
