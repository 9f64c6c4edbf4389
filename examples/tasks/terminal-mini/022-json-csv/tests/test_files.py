"""Hidden tests (generated); they run in a copy of the workspace."""


def test_json_level():
    import json
    assert json.load(open('config.json'))['logging']['level'] == 'error'


def test_json_unchanged():
    import json
    d = json.load(open('config.json'))
    assert d['name'] == 'apple' and d['workers'] == 1 and d['logging']['file'] == 'app.log'


def test_cities():
    assert open('cities.txt').read().split() == ['Paris', 'Lima', 'Oslo', 'Lima', 'Lima']
