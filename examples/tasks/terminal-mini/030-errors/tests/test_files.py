"""Hidden tests (generated); they run in a copy of the workspace."""


def test_error_count():
    assert open('error_count.txt').read().strip() == '4'
