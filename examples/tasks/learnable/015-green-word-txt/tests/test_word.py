"""Hidden tests (generated)."""


def test_file_exists():
    import os
    assert os.path.isfile('word.txt')


def test_word():
    assert open('word.txt').read().strip() == 'green'
