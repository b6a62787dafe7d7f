"""Every ```python block of README.md and docs/*.md runs, and every link between the pages resolves.

Each block runs on its own in a fresh folder, after the prelude of
docs/index.md ("How the examples run"), with ``data/train`` written by the
prelude's ``make_train()`` unless the block writes it itself. A block whose
first line is ``# docs-test: skip (REASON)`` is reported as skipped with
that reason; any other way of not running a block is a failure.
"""

from __future__ import annotations

import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGES = ["README.md"] + sorted(os.path.join("docs", f) for f in os.listdir(os.path.join(ROOT, "docs"))
                               if f.endswith(".md"))
FENCE = re.compile(r"^```([\w+-]*)[^\n]*\n(.*?)^```\s*$", re.M | re.S)
PRELUDE_MARK = "# docs prelude"
SKIP = re.compile(r"^# docs-test: skip \((.+)\)\s*$")
WRITES_TRAIN = re.compile(r"""ShardWriter\(\s*["']data/train["']""")


def fenced_blocks(text: str) -> list[tuple[str, int, str]]:
    """(language, line number of the opening fence, body) of each fenced block."""
    return [(m.group(1), text.count("\n", 0, m.start()) + 1, m.group(2)) for m in FENCE.finditer(text)]


def python_blocks() -> list[tuple[str, int, str]]:
    out = []
    for page in PAGES:
        for lang, line, body in fenced_blocks(open(os.path.join(ROOT, page), encoding="utf-8").read()):
            if lang == "python" and not body.startswith(PRELUDE_MARK):
                out.append((page, line, body))
    return out


def prelude() -> str:
    text = open(os.path.join(ROOT, "docs", "index.md"), encoding="utf-8").read()
    found = [body for lang, _, body in fenced_blocks(text) if lang == "python" and body.startswith(PRELUDE_MARK)]
    if len(found) != 1:
        raise AssertionError(f"docs/index.md must hold exactly one ```python block starting {PRELUDE_MARK!r}, "
                             f"found {len(found)}")
    return found[0]


def run_block(page: str, line: int, body: str, folder) -> None:
    """Run one block the way the docs promise: prelude, data/train, then the block, in ``folder``."""
    first = body.split("\n", 1)[0]
    skip = SKIP.match(first)
    if skip:
        pytest.skip(f"{page}:{line}: {skip.group(1)}")
    env: dict = {"__name__": "__docs__"}
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        exec(compile(prelude(), "docs/index.md (prelude)", "exec"), env)
        if not WRITES_TRAIN.search(body):
            env["make_train"]()
        # line numbers in a traceback point into the page: pad to the block's first line
        exec(compile("\n" * line + body, page, "exec"), env)
    finally:
        os.chdir(cwd)


BLOCKS = python_blocks()


@pytest.mark.parametrize("page,line,body", BLOCKS, ids=[f"{p}:{n}" for p, n, _ in BLOCKS])
def test_doc_block_runs(page, line, body, tmp_path):
    run_block(page, line, body, tmp_path)


def test_there_are_blocks_on_the_task_pages():
    """A page that lost its fences (or a regex that stopped matching) would make the suite vacuous."""
    pages = {p for p, _, _ in BLOCKS}
    for page in ("README.md", "docs/getting-started.md", "docs/checkpoints.md", "docs/distributed.md",
                 "docs/streaming.md", "docs/mixing-and-audit.md"):
        assert page in pages, f"{page} has no ```python block left"


def test_no_unfenced_code():
    """Code indented by four spaces is not run: every example must sit in a fence that says what it is."""
    for page in PAGES:
        text = open(os.path.join(ROOT, page), encoding="utf-8").read()
        outside = FENCE.sub("", text)
        lines = outside.split("\n")
        for i, ln in enumerate(lines):
            prev = lines[i - 1] if i else ""
            if ln.startswith("    ") and ln.strip() and not prev.strip():
                raise AssertionError(f"{page}: an indented code block ({ln.strip()[:60]!r}); "
                                     "fence it as ```python, ```bash or ```text")


def test_fences_name_their_language():
    for page in PAGES:
        for lang, line, _ in fenced_blocks(open(os.path.join(ROOT, page), encoding="utf-8").read()):
            assert lang in ("python", "bash", "text"), f"{page}:{line}: fence ```{lang} (use python, bash or text)"


def _anchors(path: str) -> set[str]:
    text = FENCE.sub("", open(path, encoding="utf-8").read())
    out = set()
    for m in re.finditer(r"^#+\s+(.*)$", text, re.M):
        out.add(re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-"))
    return out


def test_links_between_pages_resolve():
    for page in PAGES:
        path = os.path.join(ROOT, page)
        text = FENCE.sub("", open(path, encoding="utf-8").read())
        for link in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+://", link):
                continue
            target, _, anchor = link.partition("#")
            full = os.path.normpath(os.path.join(os.path.dirname(path), target)) if target else path
            assert os.path.exists(full), f"{page}: link {link!r}: {full} does not exist"
            if anchor and full.endswith(".md"):
                assert anchor in _anchors(full), f"{page}: link {link!r}: no heading for #{anchor}"


def test_a_broken_block_fails(tmp_path):
    """The runner itself: a block that raises is a failure, not a pass or a skip."""
    with pytest.raises(NameError):
        run_block("docs/x.md", 1, "undefined_name\n", tmp_path)
    (tmp_path / "b").mkdir()
    with pytest.raises(AssertionError):  # data/train holds the prelude's 64 samples, not 65
        run_block("docs/x.md", 1, "from shardfeed.loader import ShardDataset\n"
                                  "assert len(ShardDataset('data/train')) == 65\n", tmp_path / "b")
