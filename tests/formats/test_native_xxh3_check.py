"""formats/compiler/native.py: the C xxh3 functions found in the xxhash extension are used only where
they agree with ``xxhash.xxh3_64_intdigest`` on every length class XXH3 treats apart (the probes are
cheap now, issue #24: they must still reach the long-input loop and its tail)."""

from __future__ import annotations

import pytest
import xxhash

from shardfeed.formats.compiler import native


def test_the_native_functions_are_found_here():
    assert native._find_xxh3() != 0  # else every batch hashes in Python
    assert len(native._find_stream()) == 5  # else fields are never gathered apart (into_bytes.py)


@pytest.mark.parametrize("wrong_from", [1, 17, 129, 241, 4_096, 65_536])
def test_a_function_that_disagrees_at_any_length_is_refused(monkeypatch, wrong_from):
    """A C function that disagreed only on inputs of ``wrong_from`` bytes or more (one length class,
    or only the longest) would checksum samples of that size wrongly: every sample read would fail."""
    real = xxhash.xxh3_64_intdigest
    monkeypatch.setattr(native.xxhash, "xxh3_64_intdigest", lambda b: real(b) ^ (len(b) >= wrong_from))
    assert native._find_xxh3() == 0
    assert native._find_stream() == ()
