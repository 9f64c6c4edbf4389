"""Hidden tests (generated); they run in a copy of the workspace."""


def test_cities():
    assert open('cities.txt').read().split() == ['Lima', 'Kyoto', 'Oslo', 'Kyoto', 'Kyoto']
