"""Hidden tests (generated); they run in a copy of the workspace."""


def test_combined():
    assert open('combined.txt').read() == 'part 1: stone\npart 2: cloud\npart 3: violet\n'


def test_renamed():
    import os
    assert sorted(os.listdir('notes')) == ['copper.md', 'maple.md', 'violet.md']


def test_renamed_content():
    assert open('notes/copper.md').read() == 'note about copper\n'


def test_ini_port():
    import configparser
    c = configparser.ConfigParser()
    c.read('settings.ini')
    assert c['server']['port'] == '8738'


def test_ini_unchanged():
    import configparser
    c = configparser.ConfigParser()
    c.read('settings.ini')
    assert c['server']['host'] == '0.0.0.0' and c['logging']['level'] == 'info'
