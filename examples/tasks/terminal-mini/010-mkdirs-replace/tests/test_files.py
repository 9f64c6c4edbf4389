"""Hidden tests (generated); they run in a copy of the workspace."""


def test_dirs():
    import os
    assert all(os.path.isfile(d + '/.keep') for d in ['tests', 'build', 'scripts'])


def test_replaced():
    assert open('story.txt').read() == 'apple apple violet apple the and and and and the and apple apple tiger copper and and apple apple the apple apple\n'
