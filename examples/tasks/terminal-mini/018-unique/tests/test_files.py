"""Hidden tests (generated); they run in a copy of the workspace."""


def test_unique():
    assert open('unique.txt').read().split() == ['apple', 'cloud', 'ember', 'river', 'stone', 'tiger']
