"""The CuPy path of the graph layers and of a whole graph net gives the numpy path's numbers
(run with `-m gpu` on a CUDA machine)."""

from __future__ import annotations

import numpy as np
import pytest

from dasknn.backend import cupy_available, to_numpy
from dasknn.nn.net import Net
from tests.nn.test_graph import GRAPHS

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cp():
    if not cupy_available():
        pytest.skip("needs CuPy and a CUDA GPU")
    import cupy

    return cupy


@pytest.mark.parametrize("graph", sorted(GRAPHS))
def test_graph_net_on_gpu_matches_cpu(cp, graph):
    build, weights = GRAPHS[graph]
    cpu = Net(build(), (2, 4, 4), dtype=np.float64, seed=1, loss_weights=weights)
    gpu = cpu.copy().to(cp)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((3, 2, 4, 4)), np.array([0, 3, 1])
    ours = cpu.train_step(x, y, need_dx=True)
    theirs = gpu.train_step(cp.asarray(x), cp.asarray(y), need_dx=True)
    assert theirs["loss"] == pytest.approx(ours["loss"], rel=1e-9)
    np.testing.assert_allclose(to_numpy(theirs["dx"]), ours["dx"], rtol=1e-9, atol=1e-12)
    for key, g in ours["grads"].items():
        np.testing.assert_allclose(to_numpy(theirs["grads"][key]), g, rtol=1e-9, atol=1e-12, err_msg=key)
