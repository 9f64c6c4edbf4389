"""Hidden tests (generated); they run in a copy of the workspace."""


def test_renamed():
    import os
    assert sorted(os.listdir('notes')) == ['cloud.md', 'lemon.md', 'maple.md']


def test_renamed_content():
    assert open('notes/lemon.md').read() == 'note about lemon\n'


def test_sorted():
    assert open('sorted.txt').read().split() == ['Alice', 'Dave', 'Erin', 'Frank', 'Heidi', 'Judy', 'Oscar']
