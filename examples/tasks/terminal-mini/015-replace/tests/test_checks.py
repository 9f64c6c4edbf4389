"""Hidden tests (generated); they run in a copy of the workspace."""


def test_replaced():
    assert open('story.txt').read() == 'stone the stone and and stone apple tiger apple apple the the stone stone maple pearl and the tiger the ember stone\n'
