"""Hidden tests (generated); they run in a copy of the workspace."""


def test_dirs():
    import os
    assert all(os.path.isfile(d + '/.keep') for d in ['build', 'src', 'scripts'])


def test_env_added():
    assert open('.env').read().splitlines()[-1] == 'API_PORT=958'


def test_env_kept():
    assert open('.env').read().splitlines()[:2] == ['DEBUG=0', 'REGION=eu']


def test_renamed():
    import os
    assert sorted(os.listdir('notes')) == ['apple.md', 'lemon.md', 'tiger.md']


def test_renamed_content():
    assert open('notes/tiger.md').read() == 'note about tiger\n'
