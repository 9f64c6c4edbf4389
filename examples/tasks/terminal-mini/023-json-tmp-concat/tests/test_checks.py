"""Hidden tests (generated); they run in a copy of the workspace."""


def test_json_level():
    import json
    assert json.load(open('config.json'))['logging']['level'] == 'debug'


def test_json_unchanged():
    import json
    d = json.load(open('config.json'))
    assert d['name'] == 'stone' and d['workers'] == 5 and d['logging']['file'] == 'app.log'


def test_tmp_gone():
    import os
    assert not [f for f in os.listdir('work') if f.endswith('.tmp')]


def test_others_kept():
    import os
    assert sorted(os.listdir('work')) == ['copper.dat', 'stone.dat']


def test_combined():
    assert open('combined.txt').read() == 'part 1: stone\npart 2: violet\npart 3: pearl\n'
