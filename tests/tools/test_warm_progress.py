"""`shardfeed warm` shows its progress: a bar over its reads, and one over the compile with an estimate.

Regression: `make demo`'s set-up compiled the kernels with no output for 74 s
on a loaded machine (the reads and the one long build call printed nothing).
"""

from __future__ import annotations

import io
import time

import pytest

from shardfeed.tools import warm as W


class Tty(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.slow  # every read of warm itself: 3-5 s on the loaded 2-core machine
def test_every_read_advances_the_bar(tmp_path):
    steps = []
    W.warm(str(tmp_path), step=lambda: steps.append(1))
    assert len(steps) == W.WARM_STEPS


def test_the_compile_bar_ticks_against_its_estimate_and_ends_full():
    out = Tty()
    with W.ticking("compile", 3.0, show=True, stream=out) as bar:
        time.sleep(1.3)
        assert bar.n >= 1  # it moved while the long call ran
    text = out.getvalue()
    assert "compile" in text and "/3 s (estimate)" in text and "3/3 s" in text, text


def test_the_estimate_is_the_last_builds_rate_here(tmp_path):
    record = str(tmp_path / "last-build.json")
    assert W.build_estimate(50, record) == W.DEFAULT_BUILD_S  # nothing measured yet
    W.save_build(40, 80.0, record)
    assert W.build_estimate(50, record) == 100.0
