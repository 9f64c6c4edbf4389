"""Hidden tests (generated); they run in a copy of the workspace."""


def test_replaced():
    assert open('story.txt').read() == 'copper copper the the the copper lemon the the the copper copper the cloud the pearl the and the the and copper\n'


def test_renamed():
    import os
    assert sorted(os.listdir('notes')) == ['maple.md', 'river.md', 'tiger.md']


def test_renamed_content():
    assert open('notes/tiger.md').read() == 'note about tiger\n'


def test_combined():
    assert open('combined.txt').read() == 'part 1: lemon\npart 2: apple\npart 3: copper\n'
