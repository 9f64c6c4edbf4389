"""Hidden tests (generated); they run in a copy of the workspace."""


def test_replaced():
    assert open('story.txt').read() == 'apple lemon violet the and the apple pearl apple and the stone apple apple the and the and apple apple and apple\n'
