"""Hidden tests (generated); they run in a copy of the workspace."""


def test_env_added():
    assert open('.env').read().splitlines()[-1] == 'MAX_WORKERS=184'


def test_env_kept():
    assert open('.env').read().splitlines()[:2] == ['DEBUG=0', 'REGION=eu']


def test_error_count():
    assert open('error_count.txt').read().strip() == '2'
