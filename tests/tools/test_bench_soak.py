"""`shardfeed bench soak` in miniature: a real writer, 2 gloo ranks with loader workers,
SIGKILLs of a worker, the writer and a rank on a schedule, then the audit of the
checkpoint chain. Every published sample must be delivered exactly once."""

from __future__ import annotations

import argparse
import json

from shardfeed.tools.bench import command as bench


def test_soak_survives_each_kind_of_fault_and_loses_nothing(tmp_path, capsys):
    parser = argparse.ArgumentParser(prog="shardfeed bench")
    bench.add_arguments(parser)
    args = parser.parse_args(["soak", "--minutes", "0.25", "--fault-every-s", "3.5", "--every", "5",
                              "--out", str(tmp_path)])
    code = bench.main(args)
    out = capsys.readouterr().out
    res = json.loads((tmp_path / "bench_soak.json").read_text())
    assert code == 0, out
    assert res["published"] > 0 and res["lost"] == 0 and res["unique"] == res["published"]
    assert res["partial_shards_published"] == 0 and res["audit_exit"] == 0
    # each kind was injected at least once and all were survived
    assert all(res["faults"][k] >= 1 for k in ("worker", "writer", "rank")), res["faults"]
    assert res["survived"] == res["faults"]
    assert res["worker_errors"] >= 1  # the killed worker surfaced as WorkerError in its rank
    assert res["writers"] >= 2 and res["job_restarts"] >= 2
    assert "nothing missed" in out



def test_soak_with_a_full_disk_loses_nothing_and_publishes_no_partial_shard(tmp_path, capsys):
    """The dataset on its own small tmpfs, filled to its last 16 KiB on the schedule: the
    writer meets ENOSPC and dies, a new one continues once there is room."""
    import os
    import subprocess

    import pytest

    probe = tmp_path / "probe"
    probe.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(probe)],
                                           capture_output=True).returncode != 0:
        pytest.skip("mounting a tmpfs needs root")
    subprocess.run(["umount", str(probe)], check=True)
    parser = argparse.ArgumentParser(prog="shardfeed bench")
    bench.add_arguments(parser)
    args = parser.parse_args(["soak", "--minutes", "0.3", "--fault-every-s", "3", "--every", "5", "--disk-faults",
                              "--out", str(tmp_path)])
    code = bench.main(args)
    out = capsys.readouterr().out
    res = json.loads((tmp_path / "bench_soak.json").read_text())
    assert code == 0, out
    assert res["faults"]["disk"] >= 1 and res["survived"] == res["faults"], res["faults"]
    assert res["lost"] == 0 and res["unique"] == res["published"] and res["partial_shards_published"] == 0
    assert res["disk"]["data_tmpfs"] and res["memory_disk"]["samples"] >= 2


def test_soak_with_server_faults_the_remote_follower_loses_and_repeats_nothing(tmp_path, capsys):
    """--http-faults: a follower over loopback HTTP through a node cache beside the job, and
    500/503/reset/stall/trickle served on the schedule: every sample once, each fault served."""
    parser = argparse.ArgumentParser(prog="shardfeed bench")
    bench.add_arguments(parser)
    args = parser.parse_args(["soak", "--minutes", "0.3", "--fault-every-s", "2", "--every", "5", "--http-faults",
                              "--out", str(tmp_path)])
    code = bench.main(args)
    out = capsys.readouterr().out
    res = json.loads((tmp_path / "bench_soak.json").read_text())
    assert code == 0, out
    m = res["remote"]
    assert m["published"] == res["published"] > 0
    assert m["lost"] == 0 and m["repeated"] == 0 and m["unknown"] == 0 and m["unique"] == m["published"]
    kinds = ("http500", "http503", "reset", "stall", "trickle")
    assert all(m["faults_served"].get(k, 0) >= 1 for k in kinds), m["faults_served"]
    assert all(res["survived"][k] == res["faults"][k] >= 1 for k in kinds)
    assert m["peak_rss"] > 0 and m["peak_cache_bytes"] > 0
    assert "remote follower over HTTP" in out and "lost 0, repeated 0" in out
