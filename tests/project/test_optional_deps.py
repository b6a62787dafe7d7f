"""matplotlib and psutil are the ``bench`` extra, tensorboard and prometheus_client the ``metrics``
extra: training never needs them.

Regression: both were hard dependencies, so every trainer installing
shardfeed pulled a plotting stack. They are now imported only where a plot
is drawn or a process tree's RSS sampled, with an error that names
``pip install 'shardfeed[bench]'`` when missing.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from shardfeed.formats import ShardWriter
from shardfeed.tools.extras import MissingExtra, require
from shardfeed.tools.train.steplog import StepLog
from shardfeed.tools.train.synth import image_samples

EXE = str(Path(sys.executable).with_name("shardfeed"))


def test_library_import_and_a_local_read_load_neither(make_dataset):
    root = make_dataset(60, shard_samples=20)
    code = textwrap.dedent(f"""\
        import sys
        import shardfeed.formats, shardfeed.cache, shardfeed.loader
        from shardfeed.loader import Loader, ShardDataset
        import shardfeed.loader.metrics_export, shardfeed.tools.train.metrics
        for workers in (0, 2):
            with Loader(ShardDataset({root!r}), 8, num_workers=workers) as loader:
                assert sum(len(b["__key__"]) for b in loader) == 60
        loaded = [m for m in ("matplotlib", "psutil", "tensorboard", "torch.utils.tensorboard", "prometheus_client")
                  if m in sys.modules]
        sys.exit(f"loaded: {{loaded}}" if loaded else 0)
        """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]


def _blocked(tmp_path) -> dict:
    """An environment in which `import matplotlib` fails, as where it is not installed."""
    fake = tmp_path / "blocked" / "matplotlib"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('matplotlib is not installed (blocked by the test)')\n")
    import os

    return dict(os.environ, PYTHONPATH=str(tmp_path / "blocked"))


def test_missing_extra_names_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import raises ImportError
    with pytest.raises(MissingExtra, match=r"needs matplotlib, which is not installed: pip install "
                                           r"'shardfeed\[bench\]' \(from a clone: pip install -e '\.\[bench\]'\)"):
        require("matplotlib", "the benchmark plots")
    log = StepLog(1, 0, [])
    log.records = [{"step": 1, "epoch": 0, "loss": 1.0, "samples_per_s": 1.0, "stall": 0.0}]
    with pytest.raises(MissingExtra, match="--plot"):
        log.plot("x.png")


@pytest.mark.slow
@pytest.mark.distributed
def test_train_without_matplotlib_trains_and_skips_the_plot(tmp_path):
    with ShardWriter(str(tmp_path / "train"), max_shard_samples=50) as w:
        for s in image_samples(64, 4, 16, seed=0):
            w.write(s)
    out = subprocess.run([EXE, "train", str(tmp_path / "train"), "--ranks", "2", "--epochs", "1", "--batch-size",
                          "16", "--workers", "0", "--plot", str(tmp_path / "p.png")],
                         capture_output=True, text=True, timeout=300, env=_blocked(tmp_path))
    assert out.returncode == 0, out.stderr[-2000:]
    assert "plot: skipped (the training plot (--plot) needs matplotlib, which is not installed: pip install " \
           "'shardfeed[bench]'" in out.stdout, out.stdout
    assert not (tmp_path / "p.png").exists()
