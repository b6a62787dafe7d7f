"""`shardfeed ingest --end DATASET` ends the stream of a dataset whose writer is gone.

Regression: a stream whose writer died could not be ended from the command
line (`ingest --end` needed a SRC), so its followers waited out their idle
timeout and raised.
"""

from __future__ import annotations

import threading

from shardfeed.formats import ShardWriter
from shardfeed.loader import Loader, ShardDataset
from shardfeed.tools.cli import main


def _stream(root: str, n: int = 10) -> None:
    w = ShardWriter(root, append=True, max_shard_samples=4)
    for i in range(n):
        w.write({"__key__": f"k{i:03d}", "cls": i})
    w.close()  # the writer is gone without end_stream()


def test_ingest_end_alone_ends_a_stream_a_follower_is_reading(tmp_path, capsys):
    root = str(tmp_path / "s")
    _stream(root)
    keys: list[str] = []

    def follow():
        with Loader(ShardDataset(root, follow=True, idle_timeout_s=60, poll_s=0.05), 2) as loader:
            keys.extend(k for b in loader for k in b["__key__"])

    t = threading.Thread(target=follow, daemon=True)
    t.start()
    assert main(["ingest", "--end", root]) == 0
    t.join(timeout=30)
    assert not t.is_alive(), "the follower did not end at the end commit"
    assert sorted(keys) == [f"k{i:03d}" for i in range(10)]
    assert f"ended the stream of {root} by commit" in capsys.readouterr().out


def test_ingest_end_refuses_what_it_cannot_end(tmp_path, capsys):
    root = str(tmp_path / "s")
    _stream(root)
    assert main(["ingest", "--end", root]) == 0
    assert main(["ingest", "--end", root]) == 2
    assert "the stream was ended by commit" in capsys.readouterr().err
    complete = str(tmp_path / "c")
    with ShardWriter(complete) as w:
        w.write({"__key__": "a", "cls": 1})
    assert main(["ingest", "--end", complete]) == 2
    assert "is not a growing dataset" in capsys.readouterr().err
    assert main(["ingest", root]) == 2  # one folder without --end: say what ingest needs
    assert f"`shardfeed ingest --end {root}`" in capsys.readouterr().err


def test_ingest_end_alone_ends_an_s3_stream(tmp_path, moto_endpoint, monkeypatch, capsys):
    import boto3

    from cache_servers import s3_options

    boto3.client("s3", endpoint_url=moto_endpoint, aws_access_key_id="testing", aws_secret_access_key="testing",
                 region_name="us-east-1").create_bucket(Bucket="ending")
    for k, v in dict(AWS_ENDPOINT_URL=moto_endpoint, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
                     AWS_DEFAULT_REGION="us-east-1").items():
        monkeypatch.setenv(k, v)
    src = tmp_path / "a.jsonl"
    src.write_text("".join(f'{{"id": "r{i:03d}", "cls": 1}}\n' for i in range(12)))
    url = "s3://ending/ds"
    assert main(["ingest", str(src), url, "--key-column", "id", "--max-shard-samples", "5", "-q"]) == 0
    assert main(["ingest", "--end", url]) == 0  # the writer is gone: only the end commit
    follow = ShardDataset(url, follow=True, cache_dir=str(tmp_path / "c"), storage_options=s3_options(moto_endpoint),
                          poll_s=0.02, idle_timeout_s=30)
    assert sorted(k for b in Loader(follow, 4) for k in b["__key__"]) == [f"r{i:03d}" for i in range(12)]
    assert f"ended the stream of {url} by commit" in capsys.readouterr().out
