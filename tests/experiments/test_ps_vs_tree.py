"""Experiment 9 at its tiny setting: gradient sums on a real LocalCluster next to FireCaffe's Eq. 3/4."""

import numpy as np
import pytest

from experiments import netns_cluster, ps_vs_tree


def test_ps_vs_tree_tiny(run_tiny):
    ds, _ = run_tiny("ps_vs_tree")
    assert list(ds["k"].values) == [2] and list(ds["aggregation"].values) == ["tree", "ps"]
    sums = ds["sum_time_s"].values
    assert np.all(np.isfinite(sums)) and np.all(sums > 0) and np.all(sums < 5)
    assert float(ds["grad_bytes"].sel(payload="lenet_conv")) == 4 * (20 * 25 + 20 + 50 * 20 * 25 + 50)
    assert float(ds["bandwidth"].sel(payload="lenet_conv")) > 0
    # for k = 2 both strategies are one transfer (one-way) and Eq. 3 = Eq. 4 = 2 |∇W| / BW
    pred = ds["predicted_eq_s"].sel(k=2, payload="lenet_conv")
    assert np.isclose(float(pred.sel(aggregation="ps")), float(pred.sel(aggregation="tree")))
    ext = ds["extrapolated_s"].isel(payload=0)
    ps, tree = ext.sel(aggregation="ps").values, ext.sel(aggregation="tree").values
    assert np.allclose(ps / ps[0], ds["p"].values / 2)  # linear in p
    assert tree[-1] < ps[-1] / 5  # logarithmic: far below at p = 128


@pytest.mark.slow
def test_ps_vs_tree_engine(tmp_path):
    """The DaskEngine part: one group of 2 workers trains LeNet with each aggregation."""
    from dasknn.tradeoff.record import load

    out = tmp_path / "ps_vs_tree"
    argv = ["--out", str(out), "--workers", "2", "--repeats", "2", "--iterations", "4"]
    assert ps_vs_tree.main(argv) == 0
    ds = load(out / "ps_vs_tree.nc")
    it = ds["iter_time_s"].values
    assert np.all(np.isfinite(it)) and np.all(it > 0)


def test_bad_input():
    with pytest.raises(ValueError, match="k >= 2"):
        ps_vs_tree.measure([1], ["lenet_conv"], 1, 0)
    with pytest.raises(ValueError, match="unknown payloads"):
        ps_vs_tree.measure([2], ["vgg"], 1, 0)


@pytest.mark.slow
@pytest.mark.skipif(bool(netns_cluster.unavailable()), reason=str(netns_cluster.unavailable()))
def test_ps_vs_tree_on_per_worker_links(tmp_path):
    """k = 2 and 4 workers, each in its own network namespace behind a 200 Mbit/s link, two rounds:
    the bytes must cross the links, so no sum is faster than its serial transfers at that rate (a bound that
    holds at any load: the parameter server's k − 1 gradients arrive through its one link, the
    tree's levels follow each other)."""
    from dasknn.tradeoff.record import load

    out = tmp_path / "ps_vs_tree"
    argv = ["--tiny", "--out", str(out), "--links", "200", "--repeats", "2", "--rounds", "2"]
    assert ps_vs_tree.main(argv) == 0
    ds = load(out / "ps_vs_tree.nc").sel(rate_mbit=200.0)
    assert list(ds["round"].values) == [0, 1] and np.all(ds["load_1min"] >= 0)
    one_hop = float(ds["grad_bytes"]) / (200e6 / 8) * 0.95  # 9.3 MB at 25 MB/s, 5% for the bucket's burst
    assert np.all(ds["transfer_s"] >= one_hop)
    ps, tree = (ds["sum_time_s"].sel(aggregation=a) for a in ("ps", "tree"))
    assert np.all(ps.sel(k=2) >= one_hop) and np.all(ps.sel(k=4) >= 3 * one_hop)
    assert np.all(tree.sel(k=4) >= 2 * one_hop)
    assert "[" in (out / "table.md").read_text()  # the rounds' range is in the table
    assert not _leftover_links()


def _leftover_links() -> list[str]:
    import os
    import subprocess

    tag = f"dnn{os.getpid() % 100_000}w"
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line for line in names.splitlines() if tag in line]


def test_links_bad_input():
    with pytest.raises(ValueError, match="2 <= k <= 16"):
        ps_vs_tree.measure_links([2, 32], [100.0], 1)
    with pytest.raises(ValueError, match="rates must be > 0"):
        ps_vs_tree.measure_links([2], [0.0], 1)
    with pytest.raises(ValueError, match="rounds >= 1"):
        ps_vs_tree.measure_links([2], [100.0], 1, rounds=0)
    with pytest.raises(ValueError, match="n_workers"):
        with netns_cluster.netns_client(0, 100.0):
            pass


def test_link_rounds_give_a_spread_and_the_growth_in_k(tmp_path):
    """Planted sums (ps ∝ k, tree ∝ log2 k, each round 10% slower): the table gives median [range]
    over the rounds and `growth` the factor from the smallest k to the largest, Eq. 3/4's 4× and 3×."""
    from experiments.common import save_figure

    ks, rates, rounds = [2, 4, 8], [100.0, 400.0], 3
    order = list(ps_vs_tree.AGGREGATIONS)
    sums = np.empty((rounds, len(rates), len(ks), 2))
    for n, ri, ki in np.ndindex(rounds, len(rates), len(ks)):
        scale = (1 + 0.1 * n) * 100 / rates[ri]
        sums[n, ri, ki, order.index("ps")] = scale * ks[ki]
        sums[n, ri, ki, order.index("tree")] = scale * np.log2(ks[ki])
    transfer = np.ones((rounds, len(rates), len(ks)))
    load = np.full((rounds, 2), 3.0)
    ds = ps_vs_tree.links_dataset(sums, transfer, load, ks, rates, 9.3e6)
    assert list(ds["round"].values) == [0, 1, 2]
    grows = ps_vs_tree.growth(ds)
    np.testing.assert_allclose(grows.sel(aggregation="ps"), 4.0)
    np.testing.assert_allclose(grows.sel(aggregation="tree"), 3.0)
    text = ps_vs_tree.table_links(ds)
    assert "| 100 | 8 | 1 [1, 1] | 8.8 [8, 9.6] |" in text  # ps at k = 8: rounds 8, 8.8, 9.6 s
    assert save_figure(lambda fig: ps_vs_tree.plot_links(ds, fig), tmp_path / "links.png").stat().st_size > 0
