"""Hidden tests (generated)."""


def test_file_exists():
    import os
    assert os.path.isfile('note.txt')


def test_word():
    assert open('note.txt').read().strip() == 'green'
