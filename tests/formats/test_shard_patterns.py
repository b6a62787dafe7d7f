"""Sources written the WebDataset way (globs, brace patterns, lists) for open_index
and ShardDataset, and on_error="skip" for foreign tars that cannot be scanned."""

from __future__ import annotations

import io
import os
import tarfile
import time
from pathlib import Path

import pytest
from braceexpand import braceexpand  # test extra only: the reference our expansion must agree with
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from conftest import labelled_sample
from shardfeed.formats import ShardError, expand_braces, expand_source, open_index, open_shard
from shardfeed.formats.index import INDEX_NAME
from shardfeed.formats.shard_patterns import count_braces


def _foreign_tar(path, first: int, n: int) -> str:
    """A WebDataset tar written by tarfile: samples first..first+n-1, two members each."""
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
        for i in range(first, first + n):
            s = labelled_sample(i)
            for ext, data in (("txt", s["txt"].encode()), ("bin", s["bin"])):
                info = tarfile.TarInfo(f"{s['__key__']}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    return str(path)


def _foreign_folder(folder: Path, shards: int = 4, per: int = 5) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    return [_foreign_tar(folder / f"shards-{k:06d}.tar", k * per, per) for k in range(shards)]


def _keys(idx) -> list[str]:
    """Every sample's key, read (and checksum-checked) through the index."""
    out = []
    for i in range(len(idx)):
        with open_shard(idx, i) as r:
            out.extend(r.read(j)["__key__"] for j in range(len(r)))
    return out


def _range_keys(lo: int, hi: int) -> list[str]:
    return [f"{i:08d}" for i in range(lo, hi)]


# -- brace expansion -------------------------------------------------------

@pytest.mark.parametrize("pattern, names", [
    ("shards-{000000..000003}.tar", [f"shards-{k:06d}.tar" for k in range(4)]),
    ("s{8..11}", ["s8", "s9", "s10", "s11"]),
    ("s{08..11}", ["s08", "s09", "s10", "s11"]),
    ("{a,b,c}.tar", ["a.tar", "b.tar", "c.tar"]),
    ("{train,val}/{0..1}.tar", ["train/0.tar", "train/1.tar", "val/0.tar", "val/1.tar"]),
    ("x{a,b{1..2}}", ["xa", "xb1", "xb2"]),
    ("{3..1}", ["3", "2", "1"]),
    ("{0..10..5}", ["0", "5", "10"]),
    ("{c..a}", ["c", "b", "a"]),
    ("{,-part}", ["", "-part"]),
    ("plain.tar", ["plain.tar"]),
    ("{x}y{}", ["{x}y{}"]),  # neither a list nor a range: literal, as in bash
    ("{x{1,2}}", ["{x1}", "{x2}"]),
    ("{a,b", ["{a,b"]),  # no partner: literal
])
def test_brace_forms(pattern, names):
    assert expand_braces(pattern) == names


def test_brace_expansion_agrees_with_braceexpand_on_a_grid():
    for pattern in ["d/shards-{000000..000099}.tar", "{a,b}{1..3}{x,y}", "{-05..3}", "{0..0010}",
                    "{01..1}", "{10..0..3}", "{{a,b}}", "{a,{b,{c,d}}}e", "p{0..2}{a..c}q"]:
        assert expand_braces(pattern) == list(braceexpand(pattern)), pattern


_leaf = st.one_of(
    st.text(alphabet="abz09-_./", max_size=3),
    st.builds(lambda a, b: f"{{{a}..{b}}}", st.integers(-12, 12), st.integers(-12, 12)),
    st.builds(lambda a, b: f"{{{a:03d}..{b}}}", st.integers(0, 12), st.integers(0, 12)),
    st.builds(lambda a, b: f"{{{a}..{b}}}", st.sampled_from("abcx"), st.sampled_from("abcx")),
)
_patterns = st.recursive(_leaf, lambda inner: st.one_of(
    st.lists(inner, min_size=2, max_size=3).map("".join),
    st.lists(inner, min_size=2, max_size=3).map(lambda xs: "{" + ",".join(xs) + "}"),
), max_leaves=8)


@settings(max_examples=200, deadline=None)
@given(_patterns)
def test_brace_expansion_matches_braceexpand_property(pattern):
    assume(count_braces(pattern) <= 2000)  # braceexpand itself takes seconds on a large product
    assert expand_braces(pattern) == list(braceexpand(pattern))


@pytest.mark.parametrize("pattern", ["{0..999999}{0..9}.tar", "s-{0..99999999999999999999999}.tar",
                                     "{a,b}" * 21])
def test_brace_expansion_is_bounded_before_it_is_built(pattern):
    t0 = time.perf_counter()
    with pytest.raises(ShardError) as ei:
        expand_braces(pattern)
    assert time.perf_counter() - t0 < 1.0  # counted, never materialised
    assert ei.value.shard == pattern and "more than the limit of 1,000,000" in ei.value.reason


def test_brace_nesting_and_length_are_bounded():
    deep = "{a," * 40 + "b" + "}" * 40
    with pytest.raises(ShardError, match="nested deeper than 32"):
        expand_braces(deep)
    with pytest.raises(ShardError, match="longer than"):
        expand_braces("x" * ((1 << 20) + 1))


def test_exactly_the_limit_expands():
    assert len(expand_braces("{1..1000}{1..1000}")) == 1_000_000


# -- open_index on patterns and lists of foreign tars -----------------------

def test_glob_of_foreign_tars(tmp_path):
    _foreign_folder(tmp_path / "d")
    (tmp_path / "d" / "notes.txt").write_text("not a shard")
    idx = open_index(str(tmp_path / "d" / "*.tar"))
    assert idx.names == [f"shards-{k:06d}.tar" for k in range(4)] and idx.meta["scanned"]
    assert _keys(idx) == _range_keys(0, 20)


def test_brace_range_with_zero_padding_selects_those_shards(tmp_path):
    _foreign_folder(tmp_path / "d")
    idx = open_index(str(tmp_path / "d" / "shards-{000001..000002}.tar"))
    assert idx.names == ["shards-000001.tar", "shards-000002.tar"]
    assert _keys(idx) == _range_keys(5, 15)


def test_brace_comma_list_keeps_its_order(tmp_path):
    _foreign_folder(tmp_path / "d")
    idx = open_index(str(tmp_path / "d" / "shards-{000003,000000}.tar"))
    assert idx.names == ["shards-000003.tar", "shards-000000.tar"]
    assert _keys(idx) == _range_keys(15, 20) + _range_keys(0, 5)


@pytest.mark.parametrize("kind", [list, tuple])
def test_list_and_tuple_of_paths(tmp_path, kind):
    paths = _foreign_folder(tmp_path / "d")
    idx = open_index(kind([Path(paths[2]), paths[0]]))  # PathLike and str alike
    assert idx.names == ["shards-000002.tar", "shards-000000.tar"]
    assert _keys(idx) == _range_keys(10, 15) + _range_keys(0, 5)


def test_list_across_folders_shares_one_root(tmp_path):
    a = _foreign_folder(tmp_path / "train", shards=2)
    (tmp_path / "val").mkdir()
    b = _foreign_tar(tmp_path / "val" / "v.tar", 100, 3)
    idx = open_index([*a, b])
    assert os.path.samefile(idx.root, tmp_path)
    assert idx.names == ["train/shards-000000.tar", "train/shards-000001.tar", "val/v.tar"]
    assert _keys(idx) == _range_keys(0, 10) + _range_keys(100, 103)
    assert open_index(str(tmp_path / "{train,val}" / "*.tar")).names == idx.names


def test_file_url_in_a_list(tmp_path):
    paths = _foreign_folder(tmp_path / "d", shards=2)
    assert open_index(["file://" + paths[1]]).names == ["shards-000001.tar"]


def test_a_file_named_twice_is_read_once(tmp_path):
    paths = _foreign_folder(tmp_path / "d", shards=2)
    idx = open_index([paths[0], str(tmp_path / "d" / "*.tar")])
    assert idx.names == ["shards-000000.tar", "shards-000001.tar"]


def test_pattern_matching_nothing_names_the_pattern(tmp_path):
    _foreign_folder(tmp_path / "d")
    pattern = str(tmp_path / "d" / "*.tar.zst")
    with pytest.raises(ShardError) as ei:
        open_index(pattern)
    assert ei.value.shard == pattern and "matches no shard file" in ei.value.reason


def test_list_with_a_missing_file_names_it(tmp_path):
    paths = _foreign_folder(tmp_path / "d", shards=2)
    missing = str(tmp_path / "d" / "gone.tar")
    with pytest.raises(ShardError) as ei:
        open_index([paths[0], missing])
    assert ei.value.shard == missing and "no such file" in ei.value.reason


def test_brace_naming_a_missing_shard_names_it_and_the_pattern(tmp_path):
    _foreign_folder(tmp_path / "d")  # shards 0..3
    pattern = str(tmp_path / "d" / "shards-{000000..000004}.tar")
    with pytest.raises(ShardError) as ei:
        open_index(pattern)
    assert ei.value.shard.endswith("shards-000004.tar") and pattern in ei.value.reason


@pytest.mark.parametrize("bad, reason", [([], "empty"), (["{folder}"], "is a folder"),
                                         (["{txt}"], "not a shard file"), (["s3://b/x.tar"], "remote")])
def test_lists_that_name_no_shards(tmp_path, bad, reason):
    (tmp_path / "sub").mkdir()
    (tmp_path / "notes.txt").write_text("x")
    names = {"{folder}": str(tmp_path / "sub"), "{txt}": str(tmp_path / "notes.txt")}
    with pytest.raises(ShardError, match=reason):
        open_index([names.get(b, b) for b in bad])


def test_a_list_entry_of_the_wrong_type_is_a_clear_type_error():
    with pytest.raises(TypeError, match="a path, a pattern or a list of them"):
        expand_source([3])


def test_glob_is_not_recursive_and_skips_dotfiles_and_sidecars(tmp_path):
    _foreign_folder(tmp_path / "d", shards=1)
    _foreign_folder(tmp_path / "d" / "deep" / "er", shards=1)
    _foreign_tar(tmp_path / "d" / ".hidden.tar", 50, 1)
    (tmp_path / "d" / "shards-000000.tar.idx").write_bytes(b"x")
    assert [os.path.basename(p.path) for p in expand_source(str(tmp_path / "d" / "**"))] == ["shards-000000.tar"]


# -- patterns inside a shardfeed dataset select rows of its index -----------

def test_glob_inside_an_indexed_dataset_selects_its_rows(make_dataset):
    root = make_dataset(100, shard_samples=25)
    full = open_index(root)
    idx = open_index(os.path.join(root, "shard-00000[13].tar"))
    assert idx.root == root and idx.names == [full.names[1], full.names[3]]
    assert idx.hashes == [full.hashes[1], full.hashes[3]] and not idx.tables  # rows taken, nothing scanned
    assert not idx.meta.get("scanned") and idx.meta["selected"]
    assert _keys(idx) == _range_keys(25, 50) + _range_keys(75, 100)


def test_brace_and_single_file_inside_an_indexed_dataset(make_dataset):
    root = make_dataset(100, shard_samples=25)
    idx = open_index(os.path.join(root, "shard-{000000..000001}.tar"))
    assert idx.names == ["shard-000000.tar", "shard-000001.tar"] and idx.num_samples == 50
    one = open_index(os.path.join(root, "shard-000002.tar"))
    assert one.names == ["shard-000002.tar"] and not one.tables and one.fields == ("cls", "txt", "bin")


def test_unpublished_file_in_an_indexed_dataset(make_dataset):
    """A tar in a dataset folder that its index does not list is not published:
    a glob passes over it (a writer may be about to commit it); naming it is an error."""
    root = make_dataset(50, shard_samples=25)
    stray = _foreign_tar(os.path.join(root, "shard-000009.tar"), 500, 2)
    assert open_index(os.path.join(root, "*.tar")).names == ["shard-000000.tar", "shard-000001.tar"]
    with pytest.raises(ShardError) as ei:
        open_index([stray])
    assert ei.value.shard == stray and INDEX_NAME in ei.value.reason and "not a published shard" in ei.value.reason


def test_indexed_and_foreign_shards_in_one_list(make_dataset, tmp_path):
    root = make_dataset(50, shard_samples=25)
    foreign = _foreign_tar(tmp_path / "f.tar", 200, 4)
    idx = open_index([os.path.join(root, "shard-000001.tar"), foreign])
    assert idx.names == [f"{os.path.basename(root)}/shard-000001.tar", "f.tar"]
    assert list(idx.tables) == [1] and idx.meta["scanned"]
    assert _keys(idx) == _range_keys(25, 50) + _range_keys(200, 204)


# -- on_error for foreign tars that cannot be scanned ------------------------

def _folder_with_truncated_tar(tmp_path) -> tuple[list[str], str]:
    paths = _foreign_folder(tmp_path / "d")
    os.truncate(paths[1], 700)  # inside the first member's data
    return paths, paths[1]


def test_truncated_foreign_tar_raises_by_default_naming_it(tmp_path):
    _, bad = _folder_with_truncated_tar(tmp_path)
    with pytest.raises(ShardError) as ei:
        open_index(str(tmp_path / "d"))
    assert ei.value.shard == bad and "truncated" in ei.value.reason


@pytest.mark.parametrize("as_glob", [False, True])
def test_skip_leaves_a_truncated_foreign_tar_out_and_records_it(tmp_path, as_glob):
    """Regression: one truncated tar made the whole folder unopenable, even with on_error="skip"."""
    _, bad = _folder_with_truncated_tar(tmp_path)
    source = str(tmp_path / "d" / "*.tar") if as_glob else str(tmp_path / "d")
    idx = open_index(source, on_error="skip")
    assert idx.names == ["shards-000000.tar", "shards-000002.tar", "shards-000003.tar"]
    assert _keys(idx) == _range_keys(0, 5) + _range_keys(10, 20)
    assert [p for p, _ in idx.skipped] == [bad] and "truncated" in idx.skipped[0][1]


def test_skip_of_every_shard_gives_an_empty_index_listing_them(tmp_path):
    paths = _foreign_folder(tmp_path / "d", shards=2)
    for p in paths:
        os.truncate(p, 100)
    idx = open_index(str(tmp_path / "d"), on_error="skip")
    assert len(idx) == 0 and [p for p, _ in idx.skipped] == paths


def test_skip_does_not_hide_a_source_that_names_nothing(tmp_path):
    with pytest.raises(ShardError, match="no such file"):
        open_index([str(tmp_path / "gone.tar")], on_error="skip")


def test_unknown_on_error_is_refused(tmp_path):
    with pytest.raises(ValueError, match="'raise' .* 'skip'"):
        open_index(str(tmp_path), on_error="ignore")


# -- through ShardDataset ----------------------------------------------------

def _dataset_keys(ds) -> list[str]:
    return sorted(s["__key__"] for s in ds)


@pytest.mark.parametrize("pattern", ["*.tar", "shards-{000000..000003}.tar", "shards-00000{0,1,2,3}.tar"])
def test_shard_dataset_reads_a_pattern(tmp_path, pattern):
    from shardfeed.loader import ShardDataset

    _foreign_folder(tmp_path / "d")
    ds = ShardDataset(str(tmp_path / "d" / pattern), shuffle="none", decode=False)
    assert _dataset_keys(ds) == _range_keys(0, 20)


def test_shard_dataset_reads_a_glob_inside_an_indexed_dataset(make_dataset):
    from shardfeed.loader import ShardDataset

    root = make_dataset(100, shard_samples=25)
    ds = ShardDataset(os.path.join(root, "shard-00000[02].tar"), shuffle="global", seed=3)
    assert _dataset_keys(ds) == _range_keys(0, 25) + _range_keys(50, 75)


def test_shard_dataset_reads_a_list(tmp_path):
    from shardfeed.loader import ShardDataset

    paths = _foreign_folder(tmp_path / "d")
    assert _dataset_keys(ShardDataset(paths[:2], shuffle="none")) == _range_keys(0, 10)


def test_shard_dataset_skip_opens_a_folder_with_a_truncated_tar(tmp_path):
    from shardfeed.loader import ShardDataset

    _folder_with_truncated_tar(tmp_path)
    ds = ShardDataset(str(tmp_path / "d"), shuffle="none", on_error="skip")
    assert _dataset_keys(ds) == _range_keys(0, 5) + _range_keys(10, 20)
    assert len(ds.index.skipped) == 1
