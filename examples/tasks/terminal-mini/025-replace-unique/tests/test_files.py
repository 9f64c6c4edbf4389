"""Hidden tests (generated); they run in a copy of the workspace."""


def test_replaced():
    assert open('story.txt').read() == 'maple the the maple and the and violet violet the and the and maple stone apple maple cloud maple maple and maple\n'


def test_unique():
    assert open('unique.txt').read().split() == ['apple', 'cloud', 'ember', 'river', 'stone', 'tiger']
