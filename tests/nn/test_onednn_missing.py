"""Without oneDNN's library: "auto" computes with lowering without a warning, "onednn" refuses.

Run in a fresh interpreter with $DASKNN_ONEDNN_LIBRARY empty (no library), so it holds whether or
not this environment has the `onednn-cpu-gomp` wheel."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import REPO

SCRIPT = """
import warnings
import numpy as np
from dasknn.nn import zoo
from dasknn.nn.onednn import available, info

assert not available()
net = zoo.cifar10_quick()
x = np.zeros((2, 3, 32, 32), np.float32)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    net.forward(x)
    net.forward(x)
print(len(caught))
print(sorted({layer.backend_ran for layer in net.layers if hasattr(layer, "backend_ran")}))
print(info()["available"])
try:
    zoo.lenet(backend="onednn").forward(np.zeros((1, 1, 28, 28), np.float32))
except ImportError as err:
    print("refused:", err)
"""


def test_auto_lowers_quietly_and_onednn_refuses_without_the_library():
    env = {**os.environ, "DASKNN_ONEDNN_LIBRARY": "", "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120, check=True
    ).stdout.splitlines()
    assert out[0] == "0"
    assert out[1] == "['lowering']"
    assert out[2] == "False"
    assert out[3] == (
        "refused: oneDNN is not installed (DASKNN_ONEDNN_LIBRARY=''); pip install onednn-cpu-gomp==2023.2.0"
    )


HOLDS = """
import gc
import weakref
import numpy as np
from dasknn.nn import zoo
from dasknn.nn.onednn import capi

net = zoo.lenet()
refs = []
for _ in range(3):
    x = np.zeros((4, 1, 28, 28), np.float32)
    refs.append(weakref.ref(x))
    net.forward(x)
    del x
try:
    capi.library()
except ImportError as err:
    first = err
try:
    capi.library()
except ImportError as err:
    second = err
gc.collect()
print(sum(r() is not None for r in refs))
print(first is not second and str(first) == str(second))
"""


def test_a_missing_library_holds_no_input_of_a_forward():
    """Asking for the missing library on every layer's forward must not keep the callers' frames
    (and their arrays) alive: a stored exception raised again chains them onto its traceback."""
    env = {**os.environ, "DASKNN_ONEDNN_LIBRARY": "", "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-c", HOLDS], env=env, capture_output=True, text=True, timeout=120, check=True
    ).stdout.splitlines()
    assert out == ["0", "True"]
