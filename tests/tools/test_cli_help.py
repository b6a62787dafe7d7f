"""`--help` of each subcommand says what it does and shows defaults; counted nouns read right."""

from __future__ import annotations

import pytest

from shardfeed.tools.cli import main
from shardfeed.tools.text import plural, show_progress


@pytest.fixture(autouse=True)
def wide_terminal(monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")  # argparse wraps help to the terminal, even inside words


def _help(capsys, *argv) -> str:
    with pytest.raises(SystemExit) as e:
        main([*argv, "--help"])
    assert e.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("argv,description,defaults", [
    (["train"], "reference DDP trainer", ["--ranks RANKS", "(default: 2)", "(default: 64)", "(default: 0.1)",
                                          "(default: max label + 1"]),
    (["demo"], "the whole path on a small dataset", ["(default: demo-data)", "(default: 5000)"]),
    (["bench"], "the benchmarks, one sub-subcommand each", []),
    (["bench", "all"], "Run every benchmark", ["(default: bench-results)"]),
])
def test_help_has_description_and_defaults(capsys, argv, description, defaults):
    text = _help(capsys, *argv)
    head = text.split("options:")[0]
    assert description in head, text
    for d in defaults:
        assert d in text, (d, text)


def test_help_says_nothing_for_flags_and_unset_options(capsys):
    text = " ".join(_help(capsys, "train").split())  # columns of spaces between option and help
    assert "(default: None)" not in text and "(default: False)" not in text
    assert "--seed SEED seed of the model init and the shuffle (default: 0)" in text  # 0 is still shown


@pytest.mark.parametrize("n,noun,many,text", [
    (0, "shard", None, "0 shards"), (1, "shard", None, "1 shard"), (2, "shard", None, "2 shards"),
    (1200, "sample", None, "1,200 samples"), (1, "tar shard", None, "1 tar shard"),
    (3, "class", "classes", "3 classes"), (1, "class", "classes", "1 class"),
])
def test_plural(n, noun, many, text):
    assert plural(n, noun, many) == text


def test_progress_only_on_a_terminal(tmp_path):
    with open(tmp_path / "log", "w") as f:
        assert not show_progress(stream=f)  # a log file or CI: summary lines only

    class Tty:
        def isatty(self):
            return True

    assert show_progress(stream=Tty())
    assert not show_progress(quiet=True, stream=Tty())
