"""Hidden tests (generated); they run in a copy of the workspace."""


def test_ini_port():
    import configparser
    c = configparser.ConfigParser()
    c.read('settings.ini')
    assert c['server']['port'] == '8876'


def test_ini_unchanged():
    import configparser
    c = configparser.ConfigParser()
    c.read('settings.ini')
    assert c['server']['host'] == '0.0.0.0' and c['logging']['level'] == 'info'


def test_sorted():
    assert open('sorted.txt').read().split() == ['Alice', 'Carol', 'Dave', 'Erin', 'Ivan', 'Judy', 'Mallory']


def test_dirs():
    import os
    assert all(os.path.isfile(d + '/.keep') for d in ['scripts', 'docs', 'data'])
