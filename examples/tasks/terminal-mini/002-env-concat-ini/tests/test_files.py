"""Hidden tests (generated); they run in a copy of the workspace."""


def test_env_added():
    assert open('.env').read().splitlines()[-1] == 'API_PORT=947'


def test_env_kept():
    assert open('.env').read().splitlines()[:2] == ['DEBUG=0', 'REGION=eu']


def test_combined():
    assert open('combined.txt').read() == 'part 1: violet\npart 2: sugar\npart 3: pearl\n'


def test_ini_port():
    import configparser
    c = configparser.ConfigParser()
    c.read('settings.ini')
    assert c['server']['port'] == '8473'


def test_ini_unchanged():
    import configparser
    c = configparser.ConfigParser()
    c.read('settings.ini')
    assert c['server']['host'] == 'localhost' and c['logging']['level'] == 'info'
