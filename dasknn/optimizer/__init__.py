"""The policies of the training loop: they say what to run next, and never call the engine.

`tuner.py`: what every tuner is, a scikit-learn object (`Tuner`: its options as parameters, a fit
running a bound clone, `Tuner.for_fit`) and, for a tuner written as one generator of runs, its
answer to the loop (`StepTuner`); `auto_state.py`: the "auto" tuner's typed state.

Each is a `dasknn.policy.Policy` that `dasknn.fitting.Loop` asks for its next run.
`grid.py`: Omnivore's Algorithm 1 with its cold start (§IV-C, appendix E), the grid search over
(g, µ, η); `session.py`: one fit of it; `cold_start.py`: the appendix E-D cold start; `search.py`:
the shared pieces (probes, their scores, the HE model from probes); `online.py`: the online
optimizer, with its measurements (`measure.py`) and pure decisions (`decide.py`) apart
(Pollux/AdaptDL, YellowFin, AdaScale); `fixed.py`: fixed knobs, the trivial policy. The parts of
"auto", each pure and fed planted measurements in its tests: `prior.py` (where a fit starts: g from
the HE model, η and µ from the net's solver or the cache of the last fit), `ramp.py` (η doubled on
the training path), `trials.py` (A-B-A trials capped at 5% of the elapsed time), `momentum.py`
(total momentum regressed from the weights' trajectory) and `plateau.py` (η ÷ 3 on a plateau, then
a stop). `sizing.py` is no policy: it sizes the cluster by goodput for dask's
`Adaptive` (docs/architecture.md, "Elastic clusters").
"""

from dasknn.optimizer.auto import AutoPolicy
from dasknn.optimizer.grid import GridPolicy
from dasknn.optimizer.online import OnlinePolicy
from dasknn.optimizer.session import OptimizerResult

__all__ = ["AutoPolicy", "GridPolicy", "OnlinePolicy", "OptimizerResult"]
