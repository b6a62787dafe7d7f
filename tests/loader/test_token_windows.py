"""Token windows (loader/token_windows.py): each window a sample, equal to its slice of the concatenated stream,
through 0 and 2 workers under global shuffle and across a resume; bad tokens are refused."""

from __future__ import annotations

import numpy as np
import pytest

from shardfeed.loader import Loader, ShardDataset
from shardfeed.loader.token_windows import field_name, window_ids, write_token_windows

WINDOW = 64


@pytest.fixture(scope="module", params=["uint16", "uint32"])
def stream(request, tmp_path_factory):
    dtype = request.param
    rng = np.random.default_rng(5)
    top = 65535 if dtype == "uint16" else 200_000
    docs = [rng.integers(0, top + 1, int(n)) for n in rng.integers(1, 500, 60)]
    root = str(tmp_path_factory.mktemp(f"tokens-{dtype}"))
    info = write_token_windows(root, docs, window=WINDOW, dtype=dtype, max_shard_samples=40)
    return root, np.concatenate(docs), info, dtype


def _windows(loader, dtype):
    out = []
    for b in loader:
        x = b[field_name(dtype)]
        assert tuple(x.shape) == (len(b["__key__"]), WINDOW)  # one (batch, window) tensor
        out += list(zip(window_ids(b["__key__"]).tolist(), x.numpy().astype(np.int64)))
    return out


def test_every_window_is_its_slice_of_the_stream_through_0_and_2_workers(stream):
    root, all_tokens, info, dtype = stream
    n = len(all_tokens) // WINDOW
    assert info == {"windows": n, "tokens": len(all_tokens), "dropped_tokens": len(all_tokens) - n * WINDOW}
    seen = {}
    for workers in (0, 2):
        with Loader(ShardDataset(root, shuffle="global", seed=1), batch_size=16, num_workers=workers) as loader:
            got = _windows(loader, dtype)
        assert sorted(w for w, _ in got) == list(range(n))  # every window once
        assert [w for w, _ in got] != list(range(n))  # shuffled
        for w, x in got:
            np.testing.assert_array_equal(x, all_tokens[w * WINDOW:(w + 1) * WINDOW])
        seen[workers] = [w for w, _ in got]
    assert seen[0] == seen[2]


def test_a_resumed_job_continues_with_the_same_windows(stream):
    root, all_tokens, _, dtype = stream

    def make():
        return Loader(ShardDataset(root, shuffle="global", seed=2), batch_size=8, num_workers=2)

    with make() as ref:
        expected = [w for w, _ in _windows(ref, dtype)]
    with make() as a:
        it = iter(a)
        first = [next(it) for _ in range(5)]
        state = a.state_dict()
    with make() as b:
        b.load_state_dict(state)
        rest = _windows(b, dtype)
    head = [int(k) for batch in first for k in batch["__key__"]]
    assert head + [w for w, _ in rest] == expected
    for w, x in rest:
        np.testing.assert_array_equal(x, all_tokens[w * WINDOW:(w + 1) * WINDOW])


def test_tokens_that_do_not_fit_are_refused(tmp_path):
    with pytest.raises(ValueError, match="document 1: token ids must lie in 0..65,535"):
        write_token_windows(str(tmp_path / "a"), [np.arange(10), np.array([70000])])
    with pytest.raises(ValueError, match="1-D integer"):
        write_token_windows(str(tmp_path / "b"), [np.zeros(4, np.float32)])
    with pytest.raises(ValueError, match="uint16 or uint32"):
        write_token_windows(str(tmp_path / "c"), [np.arange(10)], dtype="int8")
