"""`shardfeed convert`: every source kind, read back with formats' readers and compared."""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import webdataset as wds
from PIL import Image

from shardfeed.formats import codec_of, decode_field, open_index, open_shard
from shardfeed.tools.cli import main
from shardfeed.tools.size_options import parse_size

WDS_TESTDATA = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "wds-testdata")


def read_all(root: str) -> list[dict]:
    """Every sample in dataset order, fields decoded to Python values (images stay bytes)."""
    idx = open_index(root)
    out = []
    for i in range(len(idx)):
        with open_shard(idx, i) as r:
            for s in r:
                out.append({k: v if k == "__key__" or codec_of(k) == "image" or not isinstance(v, bytes)
                            else decode_field(k, v) for k, v in s.items()})
    return out


def run(*argv) -> int:
    return main(["convert", "--quiet", *map(str, argv)])


@pytest.fixture
def image_folder(tmp_path):
    """3 classes of small real PNG and JPEG files (written in a non-sorted order)."""
    root = tmp_path / "images"
    files = {}
    for c, cls in enumerate(["zebra", "ant", "moth"]):
        (root / cls).mkdir(parents=True)
        for i in range(7):
            arr = np.random.default_rng(10 * c + i).integers(0, 256, (12, 10, 3), dtype=np.uint8)
            ext = "png" if i % 2 else "jpg"
            buf = io.BytesIO()
            Image.fromarray(arr).save(buf, format="PNG" if ext == "png" else "JPEG")
            (root / cls / f"img{i}.{ext}").write_bytes(buf.getvalue())
            files[f"{cls}/img{i}"] = (ext, buf.getvalue(), cls)
    (root / "ant" / "notes.txt").write_text("not an image")  # skipped, not an error
    return root, files


def check_images(dst, files):
    classes = (dst / "classes.txt").read_text().splitlines()
    assert classes == ["ant", "moth", "zebra"]
    got = read_all(str(dst))
    assert len(got) == len(files)
    for s in got:
        ext, data, cls = files[s["__key__"]]
        assert s[ext] == data
        assert classes[s["cls"]] == cls


def test_image_folder_to_tar(image_folder, tmp_path):
    src, files = image_folder
    dst = tmp_path / "out"
    assert run(src, dst, "--max-shard-samples", 5) == 0
    check_images(dst, files)
    idx = open_index(str(dst))
    assert list(idx.counts) == [5, 5, 5, 5, 1]
    assert idx.names[0] == "shard-000000.tar"
    # the tar is plain WebDataset: the webdataset library reads the same members
    keys = [s["__key__"] for s in wds.WebDataset(str(dst / idx.names[0]), shardshuffle=False)]
    assert keys == [s["__key__"] for s in read_all(str(dst))][:5]


def test_processes_two_gives_same_dataset_as_one(image_folder, tmp_path):
    src, _ = image_folder
    assert run(src, tmp_path / "one", "--max-shard-samples", 4, "--shuffle-seed", 3) == 0
    assert run(src, tmp_path / "two", "--max-shard-samples", 4, "--shuffle-seed", 3, "--processes", 2) == 0
    one, two = read_all(str(tmp_path / "one")), read_all(str(tmp_path / "two"))
    assert [s["__key__"] for s in one] == [s["__key__"] for s in two]
    assert all(a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a) for a, b in zip(one, two))
    a, b = open_index(str(tmp_path / "one")), open_index(str(tmp_path / "two"))
    assert a.names == b.names and a.hashes == b.hashes  # sample-count shards: byte-identical
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]  # no stage left behind


def test_processes_two_with_byte_limit_keeps_samples_and_order(image_folder, tmp_path):
    src, files = image_folder
    assert run(src, tmp_path / "two", "--max-shard-bytes", "4KiB", "--processes", 2) == 0
    check_images(tmp_path / "two", files)
    assert [s["__key__"] for s in read_all(str(tmp_path / "two"))] == sorted(files)
    assert len(open_index(str(tmp_path / "two"))) > 2


def test_shuffle_seed_permutes_class_ordered_input(image_folder, tmp_path):
    src, files = image_folder
    assert run(src, tmp_path / "s1", "--shuffle-seed", 1) == 0
    assert run(src, tmp_path / "s1b", "--shuffle-seed", 1, "--format", "parquet", "--image-field", "image") == 0
    assert run(src, tmp_path / "s2", "--shuffle-seed", 2) == 0
    k1 = [s["__key__"] for s in read_all(str(tmp_path / "s1"))]
    assert sorted(k1) == sorted(files) and k1 != sorted(files)
    s1b = read_all(str(tmp_path / "s1b"))
    assert k1 == [s["__key__"] for s in s1b]
    assert all(s["image"] == files[s["__key__"]][1] for s in s1b)
    assert k1 != [s["__key__"] for s in read_all(str(tmp_path / "s2"))]


def test_jsonl_with_field_mapping(tmp_path):
    rows = [{"id": f"r{i}", "label": i % 4, "caption": f"caption {i}", "meta": {"i": i, "tags": ["a"]}}
            for i in range(30)]
    src = tmp_path / "rows.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")  # a trailing blank line is fine
    for fmt in ("tar", "arrow"):
        dst = tmp_path / f"out-{fmt}"
        assert run(src, dst, "--format", fmt, "--key-column", "id", "--field", "label=cls",
                   "--field", "caption=txt", "--field", "meta=json", "--max-shard-samples", 8) == 0
        got = read_all(str(dst))
        assert got == [{"__key__": r["id"], "cls": r["label"], "txt": r["caption"], "json": r["meta"]}
                       for r in rows]


def test_jsonl_default_mapping_keeps_whole_row(tmp_path):
    rows = [{"a": i, "b": [i, None]} for i in range(5)]
    (tmp_path / "x.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert run(tmp_path / "x.jsonl", tmp_path / "out") == 0
    assert read_all(str(tmp_path / "out")) == [{"__key__": f"{i:010d}", "json": r} for i, r in enumerate(rows)]


def test_csv_with_multiline_cells_and_file_column(tmp_path, image_folder):
    src_imgs, files = image_folder
    path = tmp_path / "table.csv"
    keys = sorted(files)[:6]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["key", "label", "text", "image"])
        for i, k in enumerate(keys):
            w.writerow([f"k{i}", str(i), f"line one, {i}\nline two", os.path.join(src_imgs, k + "." + files[k][0])])
    dst = tmp_path / "out"
    assert run(path, dst, "--format", "parquet", "--key-column", "key", "--field", "label=cls",
               "--field", "text=txt", "--field", "image=bin:file", "--processes", 2) == 0
    got = read_all(str(dst))
    assert [s["__key__"] for s in got] == [f"k{i}" for i in range(6)]
    assert [s["cls"] for s in got] == list(range(6))
    assert got[3]["txt"] == "line one, 3\nline two"
    assert [s["bin"] for s in got] == [files[k][1] for k in keys]


def test_parquet_source_roundtrip(tmp_path):
    n = 50
    payload = [np.random.default_rng(i).bytes(40) for i in range(n)]
    tbl = pa.table({"__key__": [f"s{i:03d}" for i in range(n)], "cls": list(range(n)),
                    "txt": [f"t{i}" for i in range(n)], "bin": payload})
    pq.write_table(tbl.slice(0, 30), tmp_path / "a.parquet", row_group_size=7)
    pq.write_table(tbl.slice(30), tmp_path / "b.parquet", row_group_size=7)
    dst = tmp_path / "out"
    assert run(tmp_path / "*.parquet", dst, "--max-shard-samples", 16, "--shuffle-seed", 0) == 0
    got = sorted(read_all(str(dst)), key=lambda s: s["__key__"])
    assert got == [{"__key__": f"s{i:03d}", "cls": i, "txt": f"t{i}", "bin": payload[i]} for i in range(n)]


def test_reshard_webdataset_written_tars(tmp_path):
    want = {}
    for s, name in enumerate(["a.tar", "b.tar.gz"]):
        with wds.TarWriter(str(tmp_path / name)) as w:
            for i in range(12):
                key = f"{s}-{i:03d}"
                want[key] = {"cls": i % 3, "txt": f"hello {key}", "bin": bytes([s, i]) * 50}
                w.write({"__key__": key, **want[key]})
    dst = tmp_path / "out"
    assert run(tmp_path / "*.tar*", dst, "--max-shard-samples", 10, "--compression", "zstd") == 0
    got = read_all(str(dst))
    assert {s["__key__"]: {k: v for k, v in s.items() if k != "__key__"} for s in got} == want
    assert all(n.endswith(".tar.zst") for n in open_index(str(dst)).names)


def test_reshard_real_wds_testdata_to_arrow_and_back(tmp_path):
    src_idx = open_index(WDS_TESTDATA + "/sample.tgz")
    with open_shard(src_idx, 0) as r:
        want = list(r)
    assert run(WDS_TESTDATA + "/sample.tgz", tmp_path / "arrow", "--format", "arrow") == 0
    assert run(tmp_path / "arrow", tmp_path / "tar", "--max-shard-samples", 40) == 0
    got = [open_shard(open_index(str(tmp_path / "tar")), i) for i in range(3)]
    got = [s for r in got for s in r]
    assert [s["__key__"] for s in got] == [s["__key__"] for s in want]
    assert [s["png"] for s in got] == [s["png"] for s in want]
    assert [int(s["cls"]) for s in got] == [int(s["cls"]) for s in want]
    # the whole folder (3 foreign tars, gz included) re-shards with every sample
    assert run(WDS_TESTDATA, tmp_path / "all") == 0
    assert open_index(str(tmp_path / "all")).num_samples == 1190


def test_missing_source_exits_2_naming_it(tmp_path, capsys):
    assert run(tmp_path / "nope.jsonl", tmp_path / "out") == 2
    assert "nope.jsonl" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_malformed_jsonl_line_exits_2_and_publishes_nothing(tmp_path, capsys):
    lines = [json.dumps({"a": i}) for i in range(600)]
    lines[517] = '{"a": 517,'
    (tmp_path / "bad.jsonl").write_text("\n".join(lines) + "\n")
    rc = run(tmp_path / "bad.jsonl", tmp_path / "out", "--max-shard-samples", 100, "--processes", 2)
    err = capsys.readouterr().err
    assert rc == 2
    assert f"{tmp_path / 'bad.jsonl'}:518" in err and "malformed JSON" in err
    assert not (tmp_path / "out").exists()
    assert os.listdir(tmp_path) == ["bad.jsonl"]  # shards already written by the good part are gone too


def test_corrupt_image_and_bad_cell_are_named(tmp_path, image_folder, capsys):
    src, _ = image_folder
    (src / "moth" / "broken.png").write_bytes(b"\x89PNG but not really")
    assert run(src, tmp_path / "out") == 2
    assert "broken.png" in capsys.readouterr().err
    (tmp_path / "t.csv").write_text("k,label\na,1\nb,x\n")
    assert run(tmp_path / "t.csv", tmp_path / "out", "--field", "label=cls") == 2
    err = capsys.readouterr().err
    assert "t.csv:3" in err and "'x' is not an integer" in err
    assert not (tmp_path / "out").exists()


def test_refuses_existing_dataset_unless_overwrite(tmp_path, capsys):
    (tmp_path / "a.jsonl").write_text('{"v": 1}\n{"v": 2}\n')
    (tmp_path / "b.jsonl").write_text('{"v": 3}\n')
    assert run(tmp_path / "a.jsonl", tmp_path / "out") == 0
    assert run(tmp_path / "b.jsonl", tmp_path / "out") == 2
    assert "--overwrite" in capsys.readouterr().err
    assert len(read_all(str(tmp_path / "out"))) == 2
    assert run(tmp_path / "b.jsonl", tmp_path / "out", "--overwrite") == 0
    assert read_all(str(tmp_path / "out")) == [{"__key__": "0000000000", "json": {"v": 3}}]
    assert sorted(os.listdir(tmp_path)) == ["a.jsonl", "b.jsonl", "out"]


def test_mixed_image_types_to_parquet_need_image_field(image_folder, tmp_path, capsys):
    src, _ = image_folder
    assert run(src, tmp_path / "out", "--format", "parquet") == 2
    assert "--image-field" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_bad_options_exit_2(tmp_path, capsys):
    (tmp_path / "a.jsonl").write_text('{"v": 1}\n')
    for extra in (["--max-shard-bytes", "12 parsecs"], ["--compression", "gzip"], ["--field", "nocolumn"],
                  ["--processes", "0"]):
        assert run(tmp_path / "a.jsonl", tmp_path / "out", *extra) == 2
        assert capsys.readouterr().err.strip()
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("text,value", [("256MB", 256_000_000), ("1GiB", 1 << 30), ("4096", 4096),
                                        ("1.5KiB", 1536), ("64M", 64 << 20), ("2 gb", 2 * 10**9)])
def test_parse_size(text, value):
    assert parse_size(text) == value


def test_ctrl_c_mid_conversion_publishes_nothing(image_folder, tmp_path, monkeypatch, capsys):
    """KeyboardInterrupt after two shards were written: exit 130, no DST, no stage or temp files."""
    from shardfeed.tools.convert import source_kinds

    src, _ = image_folder
    real = source_kinds.ImageFolderSource.load_many
    calls = []

    def interrupted(self, ids):
        calls.append(len(ids))
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(self, ids)

    monkeypatch.setattr(source_kinds.ImageFolderSource, "load_many", interrupted)
    monkeypatch.setattr("shardfeed.tools.convert.job.BATCH", 4)
    assert run(src, tmp_path / "out", "--max-shard-samples", 3) == 130
    assert "interrupted" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["images"]


# --- interrupts, stale staging folders, --overwrite (issue: a fresh user's trial) ---------------

SHARDFEED = os.path.join(os.path.dirname(sys.executable), "shardfeed")


def _stages(folder) -> list[str]:
    return sorted(n for n in os.listdir(folder) if ".convert-" in n or ".old-" in n)


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


@pytest.mark.slow
@pytest.mark.parametrize("processes", [1, 2])
def test_sigterm_mid_conversion_removes_stage_and_exits_143(tmp_path, processes):
    """SIGTERM (kill, a scheduler) used to leave the hidden staging folder behind for good."""
    rows = "".join(json.dumps({"i": i, "t": "x" * 100}) + "\n" for i in range(80_000))
    (tmp_path / "big.jsonl").write_text(rows)
    proc = subprocess.Popen([SHARDFEED, "convert", "-q", str(tmp_path / "big.jsonl"), str(tmp_path / "out"),
                             "--max-shard-samples", "500", "--processes", str(processes)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    # a shard is being staged, or (N processes) the samples are measured and the parts planned
    while not any(f.endswith(".tar") or f == "plan.json" for _, _, fs in os.walk(tmp_path) for f in fs):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    assert _stages(tmp_path)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert "stopped by SIGTERM; nothing was written" in err
    assert sorted(os.listdir(tmp_path)) == ["big.jsonl"]


def test_stale_stage_of_dead_run_is_removed_live_one_kept(tmp_path, capsys):
    from shardfeed.formats.staging import host_tag as _host

    (tmp_path / "a.jsonl").write_text('{"v": 1}\n')
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        dead = tmp_path / f".old-data.convert-{_host()}-{_dead_pid()}"
        alive = tmp_path / f".other.convert-{_host()}-{live.pid}"
        remote = tmp_path / f".other.convert-some-other-host-{_dead_pid()}"
        for stage in (dead, alive, remote):
            (stage / "part-000").mkdir(parents=True)
            (stage / "part-000" / "shard-000000.tar").write_bytes(b"\0" * 1024)
        assert run(tmp_path / "a.jsonl", tmp_path / "out") == 0
        assert f"removed {dead}" in capsys.readouterr().err
        assert not dead.exists()
        assert alive.exists() and remote.exists()  # a live run's stage, and one we cannot judge
        assert (tmp_path / "out" / "index.arrow").exists()
    finally:
        live.kill()
        live.wait()


def test_overwrite_refuses_folder_that_is_not_a_dataset(tmp_path, capsys):
    """--overwrite onto a folder of the user's own files deleted them."""
    (tmp_path / "a.jsonl").write_text('{"v": 1}\n')
    mine = tmp_path / "out" / "thesis.tex"
    mine.parent.mkdir()
    mine.write_text("three years of work")
    assert run(tmp_path / "a.jsonl", tmp_path / "out", "--overwrite") == 2
    err = capsys.readouterr().err
    assert str(tmp_path / "out") in err and "not a shardfeed dataset" in err and "thesis.tex" in err
    assert mine.read_text() == "three years of work"
    assert sorted(os.listdir(tmp_path)) == ["a.jsonl", "out"]
    (tmp_path / "file").write_text("not a folder")
    assert run(tmp_path / "a.jsonl", tmp_path / "file", "--overwrite") == 2
    assert "is a file" in capsys.readouterr().err
    assert (tmp_path / "file").read_text() == "not a folder"


def test_overwrite_replaces_empty_folder_and_dataset(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"v": 1}\n')
    (tmp_path / "empty").mkdir()
    assert run(tmp_path / "a.jsonl", tmp_path / "empty", "--overwrite") == 0
    assert run(tmp_path / "a.jsonl", tmp_path / "empty", "--overwrite") == 0  # now a dataset
    assert len(read_all(str(tmp_path / "empty"))) == 1
    assert _stages(tmp_path) == []


def test_signal_during_publish_is_deferred(tmp_path):
    """An interrupt between moving the old dataset aside and renaming the stage would leave no DST."""
    from shardfeed.formats.staging import SignalsHeld as _SignalsHeld
    from shardfeed.tools.convert.convert_cmd import _stop_on_signals

    with _stop_on_signals():
        with _SignalsHeld() as held:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)  # the handler would run here
        assert held.caught == [signal.SIGTERM]
