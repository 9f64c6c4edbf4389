"""Hidden tests (generated); they run in a copy of the workspace."""


def test_replaced():
    assert open('story.txt').read() == 'apple the apple and the apple and and lemon the and and apple and violet apple sugar the apple the apple apple\n'
