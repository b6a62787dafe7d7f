"""The second tier of the suite: tests whose length is their point (soaks, fault matrices, peer runs,
whole training runs of several ranks). ``make test`` deselects them (``-m "not tier2"``), ``make
test-slow`` runs them (``-m tier2``), ``.ci/run`` runs both, and a plain ``pytest`` runs everything.
tests/conftest.py marks every collected test named here; tests/project/test_tiers.py checks that each
entry still names a test.

An entry is a test file (every test in it) or ``file::test`` (every parametrization of that test).
Figures: the test's seconds (setup included) in a full ``-n 2`` run on the shared 2-core machine.
"""

from __future__ import annotations

TIER2 = (
    "tests/tools/test_trainer_resume.py",  # 97 s: two-rank training runs, stopped, resumed, re-ranked
    "tests/tools/test_train_launcher.py",  # 105 s: signals to a launcher of training ranks
    "tests/tools/test_ingest_fields.py::test_train_runs_on_an_ingested_dataset_before_and_after_compact",  # 80 s
    "tests/project/test_optional_deps.py::test_train_without_matplotlib_trains_and_skips_the_plot",  # 51 s
    "tests/tools/test_bench_soak.py",  # 59 s: the soak under every kind of fault
    "tests/tools/test_train_follow_audit.py",  # 33 s: a followed stream trained on and audited
    "tests/cache/test_remote_workers_fork.py::test_spawn_without_main_guard_names_the_fix",  # 28 s
    "tests/tools/test_bench_startup.py",  # 27 s: fresh-process start-up runs
    "tests/cache/test_remote_follow.py::test_http_follow_rides_out_server_errors_and_counts_polls",  # 22 s
    "tests/tools/test_cli_verify.py::test_console_script_convert_inspect_verify",  # 21 s: the installed scripts
    "tests/tools/test_tools_train.py::test_a_rank_killed_mid_run_stops_the_job_with_one_clear_line",  # 12 s
    # peer runs of bench compare (its module fixture, 49 s, runs only for these)
    "tests/tools/test_bench_compare.py::test_throughput_rows_include_the_no_copy_form_and_first_batch",
    "tests/tools/test_bench_compare.py::test_shuffle_quality_of_a_global_shuffle_is_near_ideal_and_stored_order_is_not",
    "tests/tools/test_bench_compare.py::test_trainer_rows_have_steps_per_second_and_a_stall_fraction",
    "tests/formats/test_perf_paths.py::test_bench_compare_runs_checks_content_and_reports_a_missing_peer",  # 14 s
)


def in_tier2(nodeid: str) -> bool:
    """Whether the test ``nodeid`` (``tests/x/test_y.py::test_z[param]``) belongs to the second tier."""
    path, _, name = nodeid.partition("::")
    name = name.split("[", 1)[0]
    return any(entry == path or entry == f"{path}::{name}" for entry in TIER2)
