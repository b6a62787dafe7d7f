"""The distribution installs only under the one import name `shardfeed`."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_wheel_holds_only_shardfeed(tmp_path):
    had_build = (ROOT / "build").exists()
    try:
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                        "-w", str(tmp_path), str(ROOT)], check=True, timeout=300)
    finally:
        if not had_build:  # setuptools builds in the source tree: leave no stale copy behind
            shutil.rmtree(ROOT / "build", ignore_errors=True)
    (wheel,) = tmp_path.glob("shardfeed-*.whl")
    tops = {name.split("/", 1)[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"shardfeed"}
    names = zipfile.ZipFile(wheel).namelist()
    for sub in ("formats", "cache", "shuffling", "loader", "tools"):
        # every package folder, subfolders included: pyproject lists them by hand
        for init in (ROOT / sub).rglob("__init__.py"):
            assert f"shardfeed/{init.relative_to(ROOT).as_posix()}" in names
    entry = [n for n in names if n.endswith("entry_points.txt")]
    assert "shardfeed = shardfeed.tools.cli:main" in zipfile.ZipFile(wheel).read(entry[0]).decode()


def test_subpackages_import_without_torch_where_promised():
    # formats, shuffling and cache know nothing of torch (DESIGN.md).
    code = ("import sys; import shardfeed.formats, shardfeed.shuffling, shardfeed.cache; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False"


def test_console_script_lists_commands():
    exe = Path(sys.executable).with_name("shardfeed")
    out = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "usage: shardfeed" in out.stdout
