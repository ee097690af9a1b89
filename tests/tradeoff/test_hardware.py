"""The HE model (Omnivore §IV-B) on hand-computed numbers, its estimate from FLOPs and bytes, and
FireCaffe's communication models."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from dasknn.engine.trace import make_trace
from dasknn.nn import zoo
from dasknn.tradeoff.hardware import (
    HEModel,
    phase_costs,
    t_parameter_server,
    t_reduction_tree,
    time_per_iteration,
)

# T_cc = 8 s, T_nc = 0.5 s, t_fc = 1.5 s, N = 8:
#   k:          8    4    2    1
#   T_cc/k:     1    2    4    8
#   T_nc·k:     4    2    1    0.5
#   t_conv(k):  4    2    4    8
# HE(1) = (4 + 1.5)/1 = 5.5; HE(2) = (2 + 1.5)/2 = 1.75; HE(3) (k = 2) = (4 + 1.5)/3, not saturated
# (5.5 < 4.5 is false); HE(4) = max(1.5, 5.5/4) = 1.5, saturated (5.5 < 6); HE(8) = max(1.5, 9.5/8) = 1.5.
MODEL = HEModel(T_cc=8.0, T_nc=0.5, t_fc=1.5, n_workers=8)


def test_t_conv_is_the_max_of_compute_and_network_time():
    assert [MODEL.t_conv(k) for k in (1, 2, 4, 8)] == [8.0, 4.0, 2.0, 4.0]


def test_he_is_time_per_iteration_of_the_bottleneck():
    assert [MODEL.he(g) for g in (1, 2, 3, 4, 8)] == [5.5, 1.75, 5.5 / 3, 1.5, 1.5]
    assert MODEL.group_size(3) == 2


def test_fc_saturation_and_the_smallest_saturating_g():
    assert [MODEL.saturates(g) for g in (1, 2, 3, 4, 8)] == [False, False, False, True, True]
    assert MODEL.smallest_saturating_g() == 4
    assert MODEL.smallest_saturating_g(gs=[1, 2]) is None
    assert HEModel(T_cc=1.0, T_nc=0.0, t_fc=0.01, n_workers=4).smallest_saturating_g() is None


def test_curve_tabulates_he_and_p_he():
    curve = MODEL.curve([1, 2, 4, 8])
    assert curve.index.name == "n_groups" and list(curve.index) == [1, 2, 4, 8]
    assert curve["time_per_iter"].tolist() == [5.5, 1.75, 1.5, 1.5]
    assert curve["k"].tolist() == [8, 4, 2, 1]
    assert curve["P_HE"].tolist() == pytest.approx([1.0, 1.75 / 5.5, 1.5 / 5.5, 1.5 / 5.5])
    assert curve["fc_saturated"].tolist() == [False, False, True, True]
    assert len(MODEL.curve()) == 8


def test_from_measurements_derives_T_nc_from_model_bytes_there_and_back():
    m = HEModel.from_measurements(
        t_conv_1=3.0, t_fc=0.2, n_workers=16, conv_model_bytes=1e6, bandwidth_bytes_per_s=1e8
    )
    assert (m.T_cc, m.T_nc, m.t_fc, m.n_workers) == (3.0, 0.02, 0.2, 16)


def test_each_round_trip_adds_t_call_to_its_groups_iteration():
    # the MODEL with t_call = 0.25 s, group 0 local to the servers: a group of k > 1 sends its
    # shards' forward and backward (2 round trips), a group away from the servers its FC step and
    # push (2 more). g = 1 (k = 8, local): 5.5 + 2·0.25 = 6.0; g = 2 (k = 4): group 0 2 + 1.5 + 0.5
    # = 4.0, group 1 4.0 + 0.5 = 4.5, together 1 / (1/4 + 1/4.5) = 36/17; g = 8 (k = 1): group 0
    # 9.5, the others 9.5 + 0.5 = 10: 1 / (1/9.5 + 7/10) = 1.2422.... The servers' process, which
    # also runs group 0's lead, binds g = 2 and 8 (`t_servers`): 1.5 + 2/2 = 2.5 and 1.5 + 8/8 = 2.5
    m = HEModel(T_cc=8.0, T_nc=0.5, t_fc=1.5, n_workers=8, t_call=0.25, local_groups=1)
    assert [HEModel.round_trips(k, local) for k, local in ((1, True), (1, False), (4, True), (4, False))] == [
        0,
        2,
        2,
        4,
    ]
    assert m.he(1) == pytest.approx(6.0)
    assert m._conv_bound(2) == pytest.approx(36 / 17) and m.he(2) == pytest.approx(2.5)
    assert m._conv_bound(8) == pytest.approx(1 / (1 / 9.5 + 0.7))
    assert m.he(8) == pytest.approx(2.5) and m.saturates(8) and not m.saturates(1)
    assert not HEModel(T_cc=8.0, T_nc=0.5, t_fc=1.5, n_workers=8, t_call=1.0).saturates(4)  # 4 + 1.5 + 4 > 6
    assert MODEL.saturates(4) and MODEL.he(4) == 1.5  # t_call = 0: Omnivore's model as it was
    f = HEModel.from_measurements(3.0, 0.2, 16, 1e6, 1e8, t_call=0.001, local_groups=1)
    assert (f.t_call, f.local_groups) == (0.001, 1)
    with pytest.raises(ValueError, match="t_call"):
        HEModel(T_cc=1.0, T_nc=0.1, t_fc=0.1, n_workers=2, t_call=-1.0)


def test_the_cpu_the_iterations_need_bounds_them_where_the_processes_share_few_cores():
    # T_cc = 8, t_fc = 2, T_nc = 0.5, N = 2, t_call = 1, group 0 local; 2 cores, a round trip
    # costs 2 CPU-s. g = 2 (k = 1): critical paths 10 and 10 + 2·1 = 12, together 60/11; the CPU:
    # one round trip per iteration on average, (8 + 2 + 2) / 2 = 6: CPU-bound. g = 1 (k = 2):
    # path 4 + 2 + 2·1 = 8; CPU (10 + 2·2) / 2 = 7: the path. A background of 0.5 CPU-s per s
    # leaves 1.5 cores: g = 2 12 / 1.5 = 8, g = 1 14 / 1.5 = 28/3. The servers' process (group 0's
    # lead) at g = 2: its conv 8, two FC steps 4 and half of group 1's two trips' CPU 2, per two
    # iterations: 7, above the CPU bound (and 6 without the trips' CPU, above the paths' 60/11).
    kw = {"T_cc": 8.0, "T_nc": 0.5, "t_fc": 2.0, "n_workers": 2, "t_call": 1.0, "local_groups": 1}
    m = HEModel(**kw, cores=2, cpu_call=2.0)
    assert (m.t_cpu(2), m.t_servers(2)) == (pytest.approx(6.0), pytest.approx(7.0))
    assert m.he(2) == pytest.approx(7.0)
    assert (m.t_cpu(1), m.he(1)) == (pytest.approx(7.0), pytest.approx(8.0))
    busy = HEModel(**kw, cores=2, cpu_call=2.0, cpu_background=0.5)
    assert busy.he(2) == pytest.approx(8.0) and busy.he(1) == pytest.approx(28 / 3)
    assert HEModel(**kw, cores=2, cpu_call=2.0, cpu_work=6.0).t_cpu(2) == pytest.approx(4.0)  # (6 + 2) / 2
    free = HEModel(**kw)  # cores = 0: no CPU bound, the model as it was
    assert free.t_cpu(2) == 0.0 and free._conv_bound(2) == pytest.approx(60 / 11) and free.he(2) == 6.0
    f = HEModel.from_measurements(
        8.0, 2.0, 2, 1e6, 1e8, cores=2, cpu_call=2.0, cpu_background=0.5, cpu_work=9.0
    )
    assert (f.cores, f.cpu_call, f.cpu_background, f.cpu_work) == (2.0, 2.0, 0.5, 9.0)
    with pytest.raises(ValueError, match="cpu_background .* below cores"):
        HEModel(**kw, cores=1, cpu_background=1.0)
    with pytest.raises(ValueError, match="cpu_call"):
        HEModel(**kw, cpu_call=-1.0)


def test_a_per_batch_conv_cost_and_the_shards_calls_with_their_bytes():
    # T_cc = 8 with 2 of it per batch whatever the shard: t_conv(2) = 6/2 + 2 = 5, not 4. A remote
    # shard's forward and backward cost t_shard_call = 0.5 each, the servers' trips t_call = 0.25.
    # g = 1 (k = 2, local to the servers): 5 + 1 + 2·0.5 = 7; g = 2: group 0 (local) 8 + 1 = 9,
    # group 1 9 + 2·0.25 = 9.5, together 1 / (1/9 + 1/9.5); the servers' process (group 0's conv
    # and both FC steps) 1 + 8/2 = 5 binds.
    kw = {"T_cc": 8.0, "T_nc": 0.0, "t_fc": 1.0, "n_workers": 2, "t_call": 0.25, "local_groups": 1}
    m = HEModel(**kw, t_conv_fixed=2.0, t_shard_call=0.5)
    assert (m.t_conv(1), m.t_conv(2)) == (8.0, 5.0)
    assert (HEModel.shard_trips(1), HEModel.shard_trips(2), HEModel.shard_trips(4)) == (0, 2, 2)
    assert m.he(1) == pytest.approx(7.0)
    assert m._conv_bound(2) == pytest.approx(1 / (1 / 9 + 1 / 9.5)) and m.he(2) == pytest.approx(5.0)
    plain = HEModel(**kw)  # both 0: T_cc / k and t_call for every trip, the model as it was
    assert plain.t_conv(2) == 4.0 and plain.he(1) == pytest.approx(4 + 1 + 2 * 0.25)
    shard_only = HEModel(T_cc=8.0, T_nc=0.0, t_fc=1.0, n_workers=2, local_groups=1, t_shard_call=0.5)
    assert shard_only.he(1) == pytest.approx(4 + 1 + 1.0)  # t_call = 0: the shards' trips still count
    f = HEModel.from_measurements(8.0, 1.0, 2, 1e6, 1e8, t_conv_fixed=2.0, t_shard_call=0.5)
    assert (f.t_conv_fixed, f.t_shard_call) == (2.0, 0.5)
    with pytest.raises(ValueError, match="t_conv_fixed .* cannot exceed T_cc"):
        HEModel(**kw, t_conv_fixed=9.0)
    with pytest.raises(ValueError, match="t_shard_call"):
        HEModel(**kw, t_shard_call=-1.0)


def test_the_servers_process_binds_where_it_also_runs_a_groups_convolutions():
    # Omnivore's FC server has a machine of its own: t_servers = t_fc. On group 0's lead (local_groups
    # = 1) it also runs that group's conv and half of each other group's trips' CPU: LeNet-like
    # numbers (ms) T_cc 28.7, t_fc 6.4, cpu_call 3.4, N = 2. g = 2: 6.4 + (28.7 + 2 · 3.4 / 2) / 2 =
    # 22.45, above the groups' paths (35.1 and 35.1 + 2 · 2.8); g = 1 (k = 2): 6.4 + t_conv(2) = 20.75.
    own = HEModel(T_cc=28.7, T_nc=0.0, t_fc=6.4, n_workers=2, t_call=2.8)
    assert own.t_servers(1) == own.t_servers(2) == 6.4
    shared = HEModel(T_cc=28.7, T_nc=0.0, t_fc=6.4, n_workers=2, t_call=2.8, local_groups=1, cpu_call=3.4)
    assert shared.t_servers(2) == pytest.approx(6.4 + (28.7 + 3.4) / 2)
    assert shared.t_servers(1) == pytest.approx(6.4 + 14.35)
    assert shared._conv_bound(2) == pytest.approx(1 / (1 / 35.1 + 1 / 40.7))  # the paths: 18.85
    assert shared.he(2) == pytest.approx(22.45)
    assert shared.saturates(2) and not shared.saturates(1)
    assert own.he(2) == pytest.approx(own._conv_bound(2)) and own.he(2) < shared.he(2)


def test_lenet_phase_costs_by_hand():
    c = phase_costs(zoo.lenet(), batch_size=64)
    conv_fwd = 2 * 20 * 25 * 24 * 24 + 20 * 12 * 12 * 4 + 2 * 50 * 20 * 25 * 8 * 8 + 50 * 4 * 4 * 4
    assert c["conv_flops"] == 3 * conv_fwd * 64
    assert c["conv_model_bytes"] == 4 * (20 * 25 + 20 + 50 * 20 * 25 + 50)
    assert c["fc_model_bytes"] == 4 * (800 * 500 + 500 + 500 * 10 + 10)
    assert c["split_activation_bytes"] == 4 * 800 * 64


def test_estimate_on_lenet_gives_sane_magnitudes():
    m = HEModel.estimate(
        zoo.lenet(), batch_size=64, n_workers=8, device_gflops=100.0, bandwidth_bytes_per_s=125e6
    )
    c = phase_costs(zoo.lenet(), 64)
    assert m.T_cc == pytest.approx(c["conv_flops"] / 50e9)
    assert m.T_nc == pytest.approx(2 * c["conv_model_bytes"] / 125e6)
    assert m.t_fc == pytest.approx(c["fc_flops"] / 50e9 + 2 * c["split_activation_bytes"] / 125e6)
    assert 5e-3 < m.T_cc < 5e-2 and 5e-4 < m.T_nc < 5e-3 and 1e-3 < m.t_fc < 2e-2
    assert c["conv_flops"] / (c["conv_flops"] + c["fc_flops"]) > 0.8


def test_estimate_on_alexnet_matches_the_papers_flop_counts():
    c = phase_costs(zoo.caffenet(groups=1), batch_size=256)
    assert c["conv_flops"] == pytest.approx(1.6e12, rel=0.05)  # Omnivore L463: conv 1.6 TFLOPs
    assert c["fc_flops"] == pytest.approx(80e9, rel=0.15)  # ... and FC 80 GFLOPs


def test_firecaffe_communication_models():
    assert t_parameter_server(100e6, 32, 1.25e9) == pytest.approx(2.56)
    assert t_reduction_tree(100e6, 32, 1.25e9) == pytest.approx(0.8)
    assert t_reduction_tree(100e6, 1, 1.25e9) == 0.0
    assert t_reduction_tree(1.0, 1024, 1.0) < t_parameter_server(1.0, 1024, 1.0)


def test_time_per_iteration_adds_the_groups_rates():
    rows = [
        {"group": g, "t_start": t - 2.0, "t_end": t} for g, ts in ((0, (2, 4, 6)), (1, (3, 5, 7))) for t in ts
    ]
    assert time_per_iteration(make_trace(rows, "simulated")) == pytest.approx(1.0)
    one = make_trace([{"group": 0, "t_start": 0.0, "t_end": 3.0}], "simulated")
    assert time_per_iteration(one) == 3.0
    assert math.isnan(time_per_iteration(make_trace([], "simulated")))


def test_bad_parameters_are_rejected():
    with pytest.raises(ValueError, match="T_cc"):
        HEModel(T_cc=-1.0, T_nc=0.1, t_fc=0.1, n_workers=2)
    with pytest.raises(ValueError, match="n_groups must be in"):
        MODEL.he(9)
    with pytest.raises(ValueError, match="bandwidth"):
        HEModel.estimate(zoo.lenet(), 64, 4, device_gflops=10.0, bandwidth_bytes_per_s=0.0)
    assert isinstance(MODEL.curve([1]), pd.DataFrame)
