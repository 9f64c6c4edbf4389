"""Hidden tests (generated); they run in a copy of the workspace."""


def test_sorted():
    assert open('sorted.txt').read().split() == ['Alice', 'Erin', 'Frank', 'Heidi', 'Ivan', 'Judy', 'Mallory']


def test_dirs():
    import os
    assert all(os.path.isfile(d + '/.keep') for d in ['data', 'scripts', 'build'])


def test_json_level():
    import json
    assert json.load(open('config.json'))['logging']['level'] == 'debug'


def test_json_unchanged():
    import json
    d = json.load(open('config.json'))
    assert d['name'] == 'copper' and d['workers'] == 7 and d['logging']['file'] == 'app.log'
