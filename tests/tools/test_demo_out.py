"""`shardfeed demo --out DIR` run twice into one folder: the second run starts clean."""

import os

import pytest

from shardfeed.formats import ShardError, ShardWriter
from shardfeed.tools.train.demo import OWN, clear_out
from shardfeed.tools.train.synth import image_samples


def _stream(root: str, first_key: int) -> None:
    # as demo.main writes the stream's seed shard, appending to what is there
    with ShardWriter(root, append=True, max_shard_samples=8, prefix="seed") as w:
        for s in image_samples(8, 4, 16, seed=6, class_order=False, first_key=first_key):
            w.write(s)


def test_a_second_run_appends_to_a_fresh_stream_and_keeps_the_users_files(tmp_path):
    out = str(tmp_path / "demo")
    stream = os.path.join(out, "stream")
    _stream(stream, 0)
    with ShardWriter(stream, append=True) as w:  # the first run's ingest ended the stream
        w.end_stream()
    for name in OWN:
        os.makedirs(os.path.join(out, name), exist_ok=True)
    with open(os.path.join(out, "notes.txt"), "w") as f:
        f.write("mine")
    with pytest.raises(ShardError, match="the stream was ended"):  # what the second run met at its follow step
        _stream(stream, 100)
    clear_out(out)
    assert sorted(os.listdir(out)) == ["notes.txt"]
    _stream(stream, 100)  # the second run's seed shard goes in
    clear_out(str(tmp_path / "missing"))  # a first run: nothing to clear
