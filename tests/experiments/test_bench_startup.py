"""bench_startup's parts of `dasknn train`'s wall outside the loop, from the times its probe records."""

from __future__ import annotations

import math

import pytest

from experiments.bench_startup import PARTS, parts

MARKS = {  # seconds after the process's start (100.0) at which it passed each point
    "imported": 2.0, "ahead": 2.5, "load_start": 2.6, "load_end": 3.1, "client_called": 4.0,
    "cluster_ready": 4.5, "cluster_waited": 4.5, "fit_start": 4.5, "loop_built": 5.5, "fit_end": 16.0,
    "report_start": 16.0, "close_start": 16.0, "cluster_closed": 16.8, "report_end": 17.0,
    "close_waited": 17.0, "exit_called": 17.2,
}  # fmt: skip


def test_each_part_is_the_span_between_its_points_and_the_rest_is_what_lies_between():
    row = parts({k: 100.0 + v for k, v in MARKS.items()}, start=100.0, end=117.5, loop=10.0)
    assert list(row) == list(PARTS)
    expected = {
        "import": 2.0, "options": 0.5, "data": 0.5, "cluster_start": 2.0, "cluster_wait": 0.5,
        "fit_setup": 1.0, "fit_end": 0.5, "report": 1.0, "close_wait": 0.0, "exit_s": 0.3,
    }  # fmt: skip
    for name, seconds in expected.items():
        assert row[name] == pytest.approx(seconds, abs=1e-9), name
    # outside the loop 7.5 s, the main thread's parts 6.3 s (the cluster's start runs beside them):
    # the rest lies between them (2.5-2.6, 3.1-4.0, 17.0-17.2)
    assert row["rest"] == pytest.approx(1.2, abs=1e-9)


def test_a_checkout_that_reads_the_data_before_its_cluster_counts_options_up_to_the_load():
    marks = {k: 100.0 + v for k, v in MARKS.items() if k not in ("ahead", "client_called", "cluster_ready")}
    row = parts(marks, start=100.0, end=117.5, loop=10.0)
    assert row["options"] == pytest.approx(0.6, abs=1e-9)  # imported → the load's start
    assert math.isnan(row["cluster_start"]) and math.isnan(row["cluster_wait"])


def test_every_point_the_parts_need_is_a_function_of_this_checkout():
    """The probe wraps its points by name (skipping names a checkout lacks, for older ones): each
    mark `parts` reads is set by a point that exists here, or its part would silently be NaN."""
    import ast
    import importlib

    from experiments.bench_startup import PROBE

    tree = ast.parse(PROBE)
    points = next(
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "POINTS"
    )
    found = set()
    for module, entries in points.items():
        for where, before, after in entries:
            owner = importlib.import_module(module)
            for name in where.split("."):
                owner = getattr(owner, name, None)
            if owner is not None:
                found |= {before, after} - {None}
    needed = {m for m in MARKS if m not in ("imported", "exit_called")}  # set by the probe itself
    assert needed <= found, sorted(needed - found)
