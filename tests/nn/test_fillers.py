"""Fillers read as a prototxt writes them: the type, then only the fields away from Caffe's defaults."""

from __future__ import annotations

from dasknn.nn.fillers import Filler


def test_a_filler_shows_its_type_and_only_the_fields_it_sets():
    assert repr(Filler("xavier")) == "Filler('xavier')"
    assert repr(Filler("gaussian", std=0.01)) == "Filler('gaussian', std=0.01)"
    assert repr(Filler("msra", variance_norm="fan_out")) == "Filler('msra', variance_norm='fan_out')"
    assert eval(repr(Filler("uniform", min=-1.0)), {"Filler": Filler}) == Filler("uniform", min=-1.0)
