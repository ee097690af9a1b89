"""oneDNN kernels (`dasknn.nn.onednn`) against batched lowering, the reference.

Every layer configuration of the zoo, the shared Caffe models and the graph nets gives the same
forward outputs (max|Δ|/max|ref| ≤ 1e-5) and gradients (≤ 1e-4) from "onednn" as from "lowering",
each layer fed the same input; whole chained nets agree after 3 SGD steps; runs are bit-identical;
no layer runs a reference kernel; only the phase's entry and exit reorder; oneDNN's threads follow
the worker's setting. Without the library these tests skip, except in CI (CI=true), where CI's
install (`.[test]`) brings it and its absence is a failure.
"""

from __future__ import annotations

import os
import pickle
import time

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from dasknn.nn import zoo
from dasknn.nn.layers import LRN, Convolution, InnerProduct, Pooling, ReLU
from dasknn.nn.onednn import available, net_backends, plain
from dasknn.nn.onednn.kernels import kernel
from dasknn.nn.onednn.memory import reorder_counts, threads
from dasknn.nn.prototxt import read_net
from dasknn.nn.solver import SGD
from dasknn.nn.train import train_arrays

FORWARD_TOL, GRADIENT_TOL = 1e-5, 1e-4
KERNEL_TYPES = ("Convolution", "Pooling", "ReLU", "LRN", "InnerProduct")


@pytest.fixture(autouse=True)
def onednn():
    """Skip without the library, but fail in CI, whose install includes it."""
    if available():
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail("CI installs dasknn[test], which includes oneDNN (onednn-cpu-gomp); it does not load")
    pytest.skip("oneDNN is not installed (pip install onednn-cpu-gomp, x86-64 Linux)")


def rel(a, b) -> float:
    a, b = np.asarray(plain(a)), np.asarray(plain(b))
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def compare_layer(layer, x, seed: int = 0, need_dx: bool = True) -> dict[str, float]:
    """Relative differences of "onednn" against "lowering" on one layer: output, dx and each grad."""
    out = {}
    for backend in ("lowering", "onednn"):
        layer.backend = backend
        y, cache = layer.forward(x, train=True)
        dy = np.random.default_rng(seed).standard_normal(plain(y).shape).astype(np.float32)
        dx, grads = layer.backward(dy, cache, need_dx=need_dx)
        out[backend] = (plain(y), None if dx is None else plain(dx), grads, layer.backend_ran)
    (y0, dx0, g0, _), (y1, dx1, g1, ran) = out["lowering"], out["onednn"]
    assert ran.startswith("onednn") or ran.startswith("lowering ("), ran
    diffs = {"y": rel(y1, y0)}
    if need_dx:
        diffs["dx"] = rel(dx1, dx0)
    diffs.update({k: rel(g1[k], g0[k]) for k in g0})
    return diffs


def assert_equal_layers(net, batch: int = 2, seed: int = 0) -> int:
    """Compare every kernel layer of `net`, each fed the input a lowering forward gives it."""
    ref = net.copy()
    ref.backend = "lowering"
    x = np.random.default_rng(seed).standard_normal((batch, *net.input_shape)).astype(np.float32)
    blobs = {net.inputs[0][0]: x} if len(net.inputs) == 1 else None
    checked = 0
    for i, layer in enumerate(ref.layers):
        xs = [blobs[b] for b in ref.bottoms[i]]
        if layer.type in KERNEL_TYPES and (xs[0].ndim == 4 or layer.type == "InnerProduct"):
            # (a ReLU of the FC phase stays numpy)
            diffs = compare_layer(layer, xs[0], seed=i)
            layer.backend = "lowering"
            bad = {k: v for k, v in diffs.items() if v > (FORWARD_TOL if k == "y" else GRADIENT_TOL)}
            assert not bad, f"{net.name} layer {layer.name}: {bad}"
            checked += 1
        y, _ = layer.forward(
            xs if getattr(layer, "multi_input", False) else xs[0], rng=np.random.default_rng(i)
        )
        blobs[ref.tops[i]] = y
    return checked


ZOO = [
    pytest.param("lenet", {}, id="lenet"),
    pytest.param("cifar10_quick", {}, id="cifar10_quick"),
    pytest.param("cifar10_full", {}, id="cifar10_full"),
    pytest.param("caffenet", {"groups": 1}, id="caffenet1", marks=pytest.mark.slow),
    pytest.param("caffenet", {"groups": 2}, id="caffenet2"),
    pytest.param("resnet20", {}, id="resnet20"),
    pytest.param("mlp", {}, id="mlp"),
]


@pytest.mark.parametrize(("name", "kwargs"), ZOO)
def test_every_zoo_layer_equals_lowering(name, kwargs):
    net = zoo.NETS[name](**kwargs)
    assert assert_equal_layers(net, batch=1 if name == "caffenet" else 3) >= 2


@pytest.mark.parametrize(
    "model", ["lenet_train_test.prototxt", "cifar10_quick_train_test.prototxt", "lenet.prototxt"]
)
def test_caffe_model_layers_equal_lowering(caffe_models, model):
    shape = None if model == "lenet.prototxt" else (1, 28, 28) if "lenet" in model else (3, 32, 32)
    net = read_net(caffe_models / model, input_shape=shape)
    assert assert_equal_layers(net, batch=3) >= 4


@pytest.mark.slow
def test_googlenet_graph_layers_equal_lowering(caffe_models):
    net = read_net(caffe_models / "bvlc_googlenet_train_val.prototxt", input_shape=(3, 224, 224))
    assert assert_equal_layers(net, batch=1) > 100


CONVS = [  # (c, h, w, o, kernel, stride, pad, group)
    (3, 17, 13, 8, 3, 1, 0, 1),
    (4, 15, 15, 6, 5, 2, 2, 2),
    (6, 11, 9, 9, (3, 1), (2, 1), (1, 0), 3),
    (16, 7, 7, 32, 1, 1, 0, 1),
    (1, 28, 28, 20, 5, 1, 0, 1),
    (8, 19, 19, 16, 11, 4, 3, 1),
    (32, 9, 9, 32, 3, 2, 1, 4),
]


@pytest.mark.parametrize("conv", CONVS)
def test_convolutions_with_strides_pads_groups_odd_sizes(conv):
    c, h, w, o, k, s, p, g = conv
    layer = Convolution("conv", o, k, stride=s, pad=p, group=g)
    layer.setup((c, h, w))
    layer.init_params(np.random.default_rng(0))
    layer.params["bias"] = np.random.default_rng(1).standard_normal(o).astype(np.float32)
    x = np.random.default_rng(2).standard_normal((3, c, h, w)).astype(np.float32)
    diffs = compare_layer(layer, x)
    assert diffs["y"] <= FORWARD_TOL and max(diffs.values()) <= GRADIENT_TOL, diffs
    assert layer.backend_ran.startswith("onednn")


POOLS = [  # (pool, kernel, stride, pad, size): Caffe's ceil rounding, padding, odd sizes
    ("max", 3, 2, 0, 13),
    ("max", 2, 2, 1, 15),
    ("max", 3, 3, 1, 8),
    ("ave", 3, 2, 0, 15),
    ("ave", 3, 2, 1, 7),
    ("ave", 2, 2, 1, 8),
    ("ave", 3, 2, 1, 6),  # a window overflows the padding: Caffe's divisor, computed by lowering
    ("ave", 4, 3, 1, 5),
]


@pytest.mark.parametrize("pool", POOLS)
def test_pooling_max_and_average_with_caffes_rounding(pool):
    method, k, s, p, n = pool
    layer = Pooling("pool", method, k, stride=s, pad=p)
    layer.setup((5, n, n))
    x = np.random.default_rng(0).standard_normal((3, 5, n, n)).astype(np.float32)
    diffs = compare_layer(layer, x)
    assert diffs["y"] <= FORWARD_TOL and diffs["dx"] <= GRADIENT_TOL, diffs
    overflow = method == "ave" and p > 0 and layer._padded_extent()[0][1] > p
    assert layer.backend_ran.startswith("lowering (" if overflow else "onednn"), layer.backend_ran


INNER_PRODUCTS = [  # (input shape, outputs, bias)
    ((7,), 5, True),
    ((3, 4, 5), 11, True),
    ((50, 4, 4), 500, False),
    ((1000,), 1, True),
]


@pytest.mark.parametrize("ip", INNER_PRODUCTS)
def test_inner_products_with_and_without_bias(ip):
    shape, o, bias = ip
    layer = InnerProduct("ip", o, bias_term=bias)
    layer.setup(shape)
    layer.init_params(np.random.default_rng(0))
    if bias:
        layer.params["bias"] = np.random.default_rng(1).standard_normal(o).astype(np.float32)
    x = np.random.default_rng(2).standard_normal((3, *shape)).astype(np.float32)
    diffs = compare_layer(layer, x)
    assert diffs["y"] <= FORWARD_TOL and max(diffs.values()) <= GRADIENT_TOL, diffs
    assert layer.backend_ran.startswith("onednn"), layer.backend_ran
    assert set(diffs) == {"y", "dx", "weight", "bias"} if bias else {"y", "dx", "weight"}


def test_inner_product_without_dx_and_in_float64():
    """need_dx=False gives no dx (the first FC layer of a merged FC server); float64 stays on numpy."""
    layer = InnerProduct("ip", 4)
    layer.setup((6,))
    layer.init_params(np.random.default_rng(0))
    x = np.random.default_rng(1).standard_normal((2, 6)).astype(np.float32)
    assert compare_layer(layer, x, need_dx=False)["weight"] <= GRADIENT_TOL
    layer.backend = "auto"
    layer.params = {k: v.astype(np.float64) for k, v in layer.params.items()}
    y, cache = layer.forward(x.astype(np.float64))
    assert y.dtype == np.float64 and layer.backend_ran == "lowering"


@pytest.mark.parametrize(
    "layer",
    [
        ReLU("relu"),
        ReLU("leaky", negative_slope=0.1),
        LRN("across", 5, alpha=1e-4, beta=0.75),
        LRN("across_k2", 3, alpha=1e-3, beta=0.6, k=2.0),
        LRN("within", 3, alpha=5e-5, beta=0.75, norm_region="within_channel"),
    ],
    ids=lambda layer: layer.name,
)
def test_relu_and_lrn(layer):
    layer.setup((12, 9, 7))
    x = np.random.default_rng(0).standard_normal((3, 12, 9, 7)).astype(np.float32)
    diffs = compare_layer(layer, x)
    assert diffs["y"] <= FORWARD_TOL and diffs["dx"] <= GRADIENT_TOL, diffs
    # oneDNN's across-channel LRN has only a reference kernel for plain NCHW input (after a
    # convolution it reads the blocked layout and runs JIT code: the zoo tests check that)
    assert layer.backend_ran.startswith("onednn") or "only reference kernels" in layer.backend_ran


def sgd_steps(net, steps: int = 3, batch: int = 8):
    rng = np.random.default_rng(5)
    X = rng.standard_normal((batch * steps, *net.input_shape)).astype(np.float32)
    y = rng.integers(0, net.num_classes, batch * steps)
    solver = SGD.for_net(net, base_lr=0.01, momentum=0.9, weight_decay=5e-4)
    train_arrays(net, solver, X, y, batch_size=batch, iterations=steps, seed=0)
    return X


@pytest.mark.parametrize("name", ["lenet", "cifar10_quick", "cifar10_full"])
def test_whole_chained_net_after_3_sgd_steps(name):
    """Each backend trains its own copy 3 steps: the weights agree to float32 rounding (the updates
    themselves are ~1e-4 of the weights, so comparing them alone would measure cancellation); then
    the trained net's outputs and gradients of a new batch agree through the whole chain."""
    nets = {b: zoo.get_net(name, backend=b) for b in ("lowering", "onednn")}
    for net in nets.values():
        sgd_steps(net)
    params = {b: net.get_params() for b, net in nets.items()}
    worst = max(rel(params["onednn"][k], w) for k, w in params["lowering"].items())
    assert worst <= FORWARD_TOL, f"weights after 3 steps differ by {worst:.2e}"
    rng = np.random.default_rng(9)
    x = rng.standard_normal((8, *nets["lowering"].input_shape)).astype(np.float32)
    y = rng.integers(0, 10, 8)
    out = {}
    for backend in ("lowering", "onednn"):
        net = nets["lowering"].copy()
        net.backend = backend
        out[backend] = net.train_step(x, y, rng=np.random.default_rng(0), need_dx=True)
    assert abs(out["onednn"]["loss"] - out["lowering"]["loss"]) <= FORWARD_TOL * abs(out["lowering"]["loss"])
    assert rel(out["onednn"]["dx"], out["lowering"]["dx"]) <= GRADIENT_TOL
    for k, g in out["lowering"]["grads"].items():
        assert rel(out["onednn"]["grads"][k], g) <= GRADIENT_TOL, k


def test_same_seed_gives_bit_identical_weights():
    runs = []
    for _ in range(2):
        net = zoo.cifar10_quick(backend="onednn")
        sgd_steps(net)
        runs.append(net.get_params())
    for k in runs[0]:
        np.testing.assert_array_equal(runs[0][k], runs[1][k])


@pytest.mark.parametrize(("name", "kwargs"), ZOO[:-1])
def test_no_zoo_layer_runs_a_reference_kernel(name, kwargs):
    net = zoo.NETS[name](backend="onednn", **kwargs)
    rows = {r["layer"]: r for r in net_backends(net, batch=2)}
    for layer in net.layers:
        if layer.type in KERNEL_TYPES and not (layer.type == "ReLU" and len(layer.in_shape) != 3):
            assert rows[layer.name]["backend"].startswith("onednn"), rows[layer.name]
            assert "ref" not in rows[layer.name]["backend"].split(" ", 1)[1].split(":")[0]


def test_reorders_only_at_the_conv_phase_entry_and_exit():
    """One iteration of CIFAR-10 quick's conv phase: activations reorder once in (the input and
    d(output)) and once out (the output), never between layers; parameters once per use."""
    conv_phase, _ = zoo.cifar10_quick(backend="onednn").split_phases()
    x = np.random.default_rng(0).standard_normal((16, 3, 32, 32)).astype(np.float32)
    conv_phase.forward(x)  # builds the kernels
    before = reorder_counts()
    out, caches = conv_phase.forward(x)
    middle = reorder_counts()
    conv_phase.backward(np.ones_like(out), caches)
    after = reorder_counts()
    fwd = {k: middle[k] - before[k] for k in before}
    bwd = {k: after[k] - middle[k] for k in before}
    assert fwd["between"] == bwd["between"] == 0
    assert fwd["entry"] <= 1 and fwd["exit"] == 1  # conv1 reads 3-channel NCHW as it is
    assert bwd["entry"] == 1 and bwd["exit"] == 0
    n_conv = sum(layer.type == "Convolution" for layer in conv_phase.layers)
    assert fwd["weights"] == n_conv  # each weight reordered into the forward's layout once
    assert bwd["weights"] <= 2 * n_conv  # dW back to OIHW, and W into backward-data's layout


def test_threads_follow_the_blas_setting():
    with threadpool_limits(limits=1):
        assert threads() == 1
    with threadpool_limits(limits=2):
        assert threads() == 2


WAIT_PROBE = """
import ctypes
from dasknn.nn.onednn import capi
capi.library()
gomp = ctypes.CDLL("libgomp.so.1")
gomp.omp_display_env.argtypes = [ctypes.c_int]
gomp.omp_display_env(1)  # verbose: GNU extensions too (GOMP_SPINCOUNT)
"""


@pytest.mark.parametrize("given, spin", [(None, "0"), ("ACTIVE", "30000000000")])
def test_openmp_threads_wait_passively_unless_the_user_chose(given, spin):
    """GNU OpenMP reads OMP_WAIT_POLICY once, when it starts with libdnnl. Unset, its idle threads
    spin GOMP_SPINCOUNT = 300,000 times after each parallel region (on the cores that numpy and
    Python need between kernels); read back from the runtime itself (omp_display_env) in a fresh
    process, dasknn's PASSIVE makes that 0, and a user's own policy stays theirs (ACTIVE: spin
    without end, 3·10^10)."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    if given is not None:
        env["OMP_WAIT_POLICY"] = given
    out = subprocess.run(
        [sys.executable, "-c", WAIT_PROBE], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    shown = out.stderr + out.stdout
    assert f"OMP_WAIT_POLICY = '{given or 'PASSIVE'}'" in shown
    assert f"GOMP_SPINCOUNT = '{spin}'" in shown, shown


def cpu_over_wall(batch: int = 16, repeats: int = 3) -> float:
    """Process CPU time / wall time of CaffeNet conv2 (forward and backward) with oneDNN."""
    layer = Convolution("conv2", 256, 5, pad=2, group=2, backend="onednn")
    layer.setup((96, 27, 27))
    layer.init_params(np.random.default_rng(0))
    x = np.random.default_rng(1).standard_normal((batch, 96, 27, 27)).astype(np.float32)
    y, cache = layer.forward(x)
    layer.backward(np.ones(plain(y).shape, np.float32), cache)
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(repeats):
        y, cache = layer.forward(x)
        layer.backward(np.ones(plain(y).shape, np.float32), cache)
    return (time.process_time() - cpu) / (time.perf_counter() - wall)


def test_one_thread_uses_one_core():
    with threadpool_limits(limits=1):
        assert cpu_over_wall() < 1.2


class _Probe:
    """A stand-in kernel class: records the OpenMP thread count it was built under."""

    def __init__(self, tag: str) -> None:
        self.tag, self.built_with = tag, _omp().omp_get_max_threads()


def _omp():
    import ctypes

    gomp = ctypes.CDLL("libgomp.so.1")
    gomp.omp_get_max_threads.restype = ctypes.c_int
    gomp.omp_set_num_threads.argtypes = [ctypes.c_int]
    return gomp


def test_kernels_are_built_with_the_blas_setting_and_cached_per_thread_count():
    """oneDNN fixes a convolution's OpenMP team when it creates it: a kernel is built under the
    worker's count (not whatever this thread's OpenMP count was) and cached under it, so a count
    that changes later (workers joining a one-machine cluster) gets kernels of its own."""
    tag = f"probe-{time.monotonic_ns()}"  # a key no earlier test cached
    with threadpool_limits(limits=2, user_api="blas"):
        _omp().omp_set_num_threads(1)
        two = kernel(_Probe, tag)
    with threadpool_limits(limits=1, user_api="blas"):
        _omp().omp_set_num_threads(2)
        one = kernel(_Probe, tag)
        assert kernel(_Probe, tag) is one
    assert (two.built_with, one.built_with) == (2, 1)
    assert one is not two


def _one_iteration_on_the_worker() -> tuple[int, dict[str, str]]:
    """One CIFAR-10 quick SGD step (backend "auto"): oneDNN's thread count in this task thread and
    what each layer with a kernel ran."""
    net = zoo.cifar10_quick(backend="auto")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 3, 32, 32)).astype(np.float32)
    net.train_step(x, rng.integers(0, 10, 4), rng=rng)
    ran = {layer.name: layer.backend_ran for layer in net.layers if layer.type in KERNEL_TYPES}
    return threads(), ran


def _blas_threads() -> int:
    from threadpoolctl import threadpool_info

    return max(p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas")


def test_a_dask_worker_runs_onednn_on_its_share_of_the_cores():
    """A worker of one thread keeps oneDNN on one core. Given two (`SharedCores`: 2 cores, 1
    worker), oneDNN's OpenMP threads take them and the whole iteration runs on them, the FC phase's
    inner products included: numpy's BLAS is not called, so OpenBLAS's threads (which spin on a core
    after each call) do not take the cores from oneDNN's between two kernels (at 2 threads that made
    an iteration slower than at 1)."""
    distributed = pytest.importorskip("distributed")
    from dasknn.engine.dask.nanny import share_cores

    with (
        distributed.LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=None) as cluster,
        distributed.Client(cluster) as client,
    ):
        one = client.submit(lambda: (threads(), cpu_over_wall(batch=8, repeats=2)), pure=False).result()
        share_cores(client, 2)
        deadline = time.monotonic() + 30
        while set(client.run(_blas_threads).values()) != {2} and time.monotonic() < deadline:
            time.sleep(0.05)
        two, ran = client.submit(_one_iteration_on_the_worker, pure=False).result()
    assert one[0] == 1 and one[1] < 1.2
    assert two == 2
    assert {"conv1", "pool1", "ip1", "ip2"} <= set(ran)
    assert all(r.startswith("onednn") for r in ran.values()), ran


def test_backend_round_trips_through_copies_pickles_and_phase_splits():
    net = zoo.lenet(backend="lowering")
    assert net.backend == "lowering"
    assert pickle.loads(pickle.dumps(net)).backend == "lowering"
    assert net.copy().backend == "lowering"
    conv, fc = net.split_phases()
    assert conv.backend == "lowering"
    net.layer("conv1").backend = "onednn"
    assert pickle.loads(pickle.dumps(net)).backend == "mixed"
    with pytest.raises(ValueError, match="unknown backend 'mkl'"):
        zoo.lenet(backend="mkl")


def test_blocked_caches_pickle_as_plain_arrays():
    net = zoo.cifar10_quick(backend="onednn")
    x = np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)
    _, caches = net.forward(x)
    conv2_src = caches[3].data[0]
    restored = pickle.loads(pickle.dumps(conv2_src))
    assert isinstance(restored, np.ndarray) and restored.shape == (2, 32, 16, 16)
    np.testing.assert_array_equal(restored, plain(conv2_src))


def test_explicit_onednn_refuses_float64():
    layer = Convolution("conv", 4, 3, backend="onednn")
    layer.setup((2, 5, 5))
    layer.init_params(np.random.default_rng(0), np.float64)
    with pytest.raises(ValueError, match="backend 'onednn' computes float32 numpy arrays, got numpy float64"):
        layer.forward(np.zeros((1, 2, 5, 5)))
    layer.backend = "auto"
    layer.forward(np.zeros((1, 2, 5, 5)))
    assert layer.backend_ran == "lowering"


def test_info_names_onednn(capsys):
    from dasknn.cli import main

    assert main(["info"]) == 0
    assert "kernels: oneDNN 3.2" in capsys.readouterr().out


@pytest.mark.slow
def test_lenet_reaches_the_main_jobs_target_with_onednn_as_with_lowering():
    """The main job (`dasknn train`): LeNet on the 5,000-image MNIST sample, 20% held out, 96%
    held-out accuracy. Both backends train the same seeded net with Caffe's LeNet solver."""
    import dask
    from sklearn.model_selection import train_test_split

    from dasknn.data import load
    from dasknn.estimator_params import BY_NAME
    from dasknn.nn.train import evaluate

    X, y = dask.compute(*load("mnist-sample"))
    X_train, X_val, y_train, y_val = train_test_split(X, y, test_size=0.2, stratify=y, random_state=0)
    accuracy = {}
    for backend in ("lowering", "onednn"):
        net = zoo.lenet(seed=0, backend=backend)
        solver = SGD.for_net(
            net, base_lr=0.01, momentum=0.9, weight_decay=5e-4, lr_policy="inv", gamma=1e-4, power=0.75
        )
        train_arrays(net, solver, X_train, y_train, batch_size=64, iterations=300, seed=0)
        accuracy[backend] = evaluate(net, X_val, y_val)[1]
    target = BY_NAME["target_accuracy"].command_default  # `dasknn train`'s
    assert min(accuracy.values()) >= target, accuracy
    assert abs(accuracy["onednn"] - accuracy["lowering"]) <= 0.01, accuracy


def test_dasknn_info_and_the_experiments_machine_line_name_onednn():
    import contextlib
    import io

    from dasknn.cli import main
    from experiments.common import machine_line

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["info"]) == 0
    kernels = [line for line in out.getvalue().splitlines() if line.startswith("kernels:")]
    assert len(kernels) == 1 and kernels[0].startswith("kernels: oneDNN 3."), out.getvalue()
    assert "kernels: oneDNN 3." in machine_line()
