"""Hidden tests (generated); they run in a copy of the workspace."""


def test_tmp_gone():
    import os
    assert not [f for f in os.listdir('work') if f.endswith('.tmp')]


def test_others_kept():
    import os
    assert sorted(os.listdir('work')) == ['maple.dat', 'pearl.dat']
