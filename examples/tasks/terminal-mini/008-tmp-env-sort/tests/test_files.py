"""Hidden tests (generated); they run in a copy of the workspace."""


def test_tmp_gone():
    import os
    assert not [f for f in os.listdir('work') if f.endswith('.tmp')]


def test_others_kept():
    import os
    assert sorted(os.listdir('work')) == ['cloud.dat', 'river.dat']


def test_env_added():
    assert open('.env').read().splitlines()[-1] == 'MAX_WORKERS=784'


def test_env_kept():
    assert open('.env').read().splitlines()[:2] == ['DEBUG=0', 'REGION=eu']


def test_sorted():
    assert open('sorted.txt').read().split() == ['Alice', 'Bob', 'Carol', 'Dave', 'Frank', 'Ivan', 'Judy']
