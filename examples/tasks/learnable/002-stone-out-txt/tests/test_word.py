"""Hidden tests (generated)."""


def test_file_exists():
    import os
    assert os.path.isfile('out.txt')


def test_word():
    assert open('out.txt').read().strip() == 'stone'
