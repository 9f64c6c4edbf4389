"""Hidden tests (generated); they run in a copy of the workspace."""


def test_renamed():
    import os
    assert sorted(os.listdir('notes')) == ['apple.md', 'lemon.md', 'tiger.md']


def test_renamed_content():
    assert open('notes/apple.md').read() == 'note about apple\n'
