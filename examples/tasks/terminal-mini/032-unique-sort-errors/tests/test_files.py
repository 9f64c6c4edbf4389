"""Hidden tests (generated); they run in a copy of the workspace."""


def test_unique():
    assert open('unique.txt').read().split() == ['apple', 'cloud', 'ember', 'river', 'tiger']


def test_sorted():
    assert open('sorted.txt').read().split() == ['Alice', 'Bob', 'Erin', 'Grace', 'Ivan', 'Mallory', 'Oscar']


def test_error_count():
    assert open('error_count.txt').read().strip() == '3'
