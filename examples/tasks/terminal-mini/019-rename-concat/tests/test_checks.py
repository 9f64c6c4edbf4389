"""Hidden tests (generated); they run in a copy of the workspace."""


def test_renamed():
    import os
    assert sorted(os.listdir('notes')) == ['apple.md', 'pearl.md', 'tiger.md']


def test_renamed_content():
    assert open('notes/apple.md').read() == 'note about apple\n'


def test_combined():
    assert open('combined.txt').read() == 'part 1: river\npart 2: pearl\npart 3: tiger\n'
