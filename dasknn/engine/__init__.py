"""Engines: the run of g compute groups for a budget, returning a Trace (docs/architecture.md "Layers").

At this level, what every engine shares: `trace` (RunConfig, Budget, TrainState, the Trace and
the Engine protocol), `strategy` (Omnivore's layout or another paper's, and RALP's split),
`checkpoint`, `servers` (the conv model server and the merged FC server as plain classes),
`schedule` (η and µ as a Schedule of the iteration, which the servers evaluate at each update) and
`autotune` (Crossbow's learner auto-tuner, which only calls `engine.run`). The engines sit in
`dask/` (`DaskEngine`) and `simulated/` (`SimulatedEngine`); this package imports neither, so the
simulator never loads Dask code by importing it.
"""
