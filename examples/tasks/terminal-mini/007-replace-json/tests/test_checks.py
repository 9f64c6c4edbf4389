"""Hidden tests (generated); they run in a copy of the workspace."""


def test_replaced():
    assert open('story.txt').read() == 'violet pearl lemon violet the and and violet violet and and and the and maple the tiger the the violet violet violet\n'


def test_json_level():
    import json
    assert json.load(open('config.json'))['logging']['level'] == 'error'


def test_json_unchanged():
    import json
    d = json.load(open('config.json'))
    assert d['name'] == 'sugar' and d['workers'] == 5 and d['logging']['file'] == 'app.log'
