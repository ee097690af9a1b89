"""experiments/ab_main_job: a contender's name gives its `dasknn train` flags, extras included."""

from __future__ import annotations

import pytest

from experiments.ab_main_job import flags_of, is_auto


def test_a_contenders_extras_become_dasknn_train_flags():
    assert flags_of("auto") == [] and is_auto("auto+ema") and is_auto("base:auto")
    assert flags_of("base:auto+ema") == ["--averaging", "ema"]
    assert flags_of("2,0.03,0.9+ema+shuffle-window=4") == [
        "--n-groups", "2", "--lr", "0.03", "--momentum", "0.9",
        "--averaging", "ema", "--shuffle-window", "4",
    ]  # fmt: skip
    assert not is_auto("2,0.03,0.9+ema")
    with pytest.raises(ValueError, match="extra 'swa' is neither"):
        flags_of("auto+swa")
