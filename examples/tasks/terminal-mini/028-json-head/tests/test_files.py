"""Hidden tests (generated); they run in a copy of the workspace."""


def test_json_level():
    import json
    assert json.load(open('config.json'))['logging']['level'] == 'error'


def test_json_unchanged():
    import json
    d = json.load(open('config.json'))
    assert d['name'] == 'violet' and d['workers'] == 6 and d['logging']['file'] == 'app.log'


def test_head():
    assert open('head.txt').read().splitlines() == ['line 0 maple', 'line 1 maple', 'line 2 river', 'line 3 pearl', 'line 4 violet']
