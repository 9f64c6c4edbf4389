"""Hidden tests (generated)."""


def test_file_exists():
    import os
    assert os.path.isfile('answer.txt')


def test_word():
    assert open('answer.txt').read().strip() == 'sugar'
