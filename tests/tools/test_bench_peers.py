"""The benchmarks' one peer-adapter registry (tools/bench/peers.py): every registered adapter keeps the
declared contract. Those whose library this interpreter has write the samples and read one epoch back,
content-checked, shuffled and not; the others (a library not installed here, or one that runs in a venv of
its own) are checked for their declared members only."""

from __future__ import annotations

import inspect

import pytest

from shardfeed.tools.bench import fresh, peers
from shardfeed.tools.bench.samples import ContentCheck, SampleSpec

NAMES = sorted(peers.ADAPTERS)


def _runs_here(a: peers.Adapter) -> bool:
    return a.venv is None and a.installed()


@pytest.mark.parametrize("name", NAMES)
def test_every_adapter_declares_the_contract(name):
    a = peers.ADAPTERS[name]
    assert isinstance(a, peers.Adapter) and not inspect.isabstract(type(a))
    assert a.name == name and peers.adapter(name) is a
    assert isinstance(a.label, str) and a.label and isinstance(a.CONFIG, str) and a.CONFIG
    assert isinstance(a.peer, bool) and a.peer == (not name.startswith("shardfeed"))
    assert a.modules and all(isinstance(m, str) and m for m in a.modules)
    assert a.venv is None or a.venv in fresh.VENVS
    assert a.data_name in peers.ADAPTERS  # a variant reads data that a registered adapter writes
    assert isinstance(a.installed(), bool)
    for member in ("load", "write", "files", "batches"):
        assert callable(getattr(a, member))


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("name", NAMES)
def test_every_installed_adapter_writes_and_reads_one_epoch_back(name, shuffle, tmp_path_factory):
    a = peers.ADAPTERS[name]
    if not _runs_here(a):
        pytest.skip(f"{name}: {'runs in its own venv' if a.venv else 'not installed here'} (members checked)")
    spec = SampleSpec(96, 256)
    folder = tmp_path_factory.mktemp(a.data_name)
    peers.adapter(a.data_name).write(spec, str(folder))
    assert a.files(str(folder)), f"{name} wrote no data files"
    a.load(read=True)
    check = ContentCheck()
    batches = 0
    for keys, payloads, classes in a.batches(str(folder), 0, shuffle, 32):
        check.add(keys, payloads, classes)
        batches += 1
    assert check.mismatch(spec.expected()) is None, (name, check.result())
    assert batches >= 3


def test_an_adapter_without_a_read_path_cannot_be_made():
    class WriteOnly(peers.Adapter):
        name, label, CONFIG, modules = "write-only", "write only", "none", ("os",)

        def write(self, spec, folder):
            pass

    with pytest.raises(TypeError, match="batches"):
        WriteOnly()


def test_the_install_check_imports_nothing_and_says_no_for_an_absent_library():
    class Absent(peers.WebDatasetAdapter):
        modules = ("no_such_library_for_the_bench",)

    assert Absent().installed() is False
    assert peers.ADAPTERS["shardfeed"].installed() is True


def test_an_unknown_adapter_names_the_registered_ones():
    with pytest.raises(KeyError, match="no peer adapter 'nosuch'; registered: shardfeed"):
        peers.adapter("nosuch")


def test_a_library_with_a_venv_runs_under_it_only_where_it_exists(tmp_path):
    assert peers.python_for("streaming", None) == peers.python_for("shardfeed", "/x/python")
    assert peers.python_for("streaming", "/x/python") == "/x/python"
    with pytest.raises(ValueError, match="not an executable python; make the venv with tools/bench/install_peers.sh"):
        peers.peers_python(str(tmp_path / "nope"))
