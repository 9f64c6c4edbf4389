"""Hidden tests (generated); they run in a copy of the workspace."""


def test_renamed():
    import os
    assert sorted(os.listdir('notes')) == ['copper.md', 'sugar.md', 'tiger.md']


def test_renamed_content():
    assert open('notes/sugar.md').read() == 'note about sugar\n'


def test_tmp_gone():
    import os
    assert not [f for f in os.listdir('work') if f.endswith('.tmp')]


def test_others_kept():
    import os
    assert sorted(os.listdir('work')) == ['stone.dat', 'sugar.dat']


def test_env_added():
    assert open('.env').read().splitlines()[-1] == 'API_PORT=132'


def test_env_kept():
    assert open('.env').read().splitlines()[:2] == ['DEBUG=0', 'REGION=eu']
