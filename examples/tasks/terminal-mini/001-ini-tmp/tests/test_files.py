"""Hidden tests (generated); they run in a copy of the workspace."""


def test_ini_port():
    import configparser
    c = configparser.ConfigParser()
    c.read('settings.ini')
    assert c['server']['port'] == '8215'


def test_ini_unchanged():
    import configparser
    c = configparser.ConfigParser()
    c.read('settings.ini')
    assert c['server']['host'] == 'localhost' and c['logging']['level'] == 'info'


def test_tmp_gone():
    import os
    assert not [f for f in os.listdir('work') if f.endswith('.tmp')]


def test_others_kept():
    import os
    assert sorted(os.listdir('work')) == ['stone.dat', 'violet.dat']
