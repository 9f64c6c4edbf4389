"""Hidden tests (generated); they run in a copy of the workspace."""


def test_replaced():
    assert open('story.txt').read() == 'sugar sugar and sugar apple sugar the stone the and and and the and the the pearl and sugar sugar the sugar\n'
