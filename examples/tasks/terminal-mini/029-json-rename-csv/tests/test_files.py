"""Hidden tests (generated); they run in a copy of the workspace."""


def test_json_level():
    import json
    assert json.load(open('config.json'))['logging']['level'] == 'debug'


def test_json_unchanged():
    import json
    d = json.load(open('config.json'))
    assert d['name'] == 'pearl' and d['workers'] == 2 and d['logging']['file'] == 'app.log'


def test_renamed():
    import os
    assert sorted(os.listdir('notes')) == ['lemon.md', 'maple.md', 'stone.md']


def test_renamed_content():
    assert open('notes/lemon.md').read() == 'note about lemon\n'


def test_cities():
    assert open('cities.txt').read().split() == ['Lima', 'Kyoto', 'Kyoto', 'Accra', 'Accra']
