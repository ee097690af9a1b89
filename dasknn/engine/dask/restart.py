"""Recovery from a lost worker for the runners without server snapshots: the unmerged map and the
replica strategies (SMA, model averaging).

Their state lives in actors that a lost worker can take with it, and their loops return their rows
only at the end, so the snapshot is the state the run started from (a fit runs the engine in short
runs: what is redone is bounded by one run). On a lost worker of the run: re-plan onto the workers
left (the unmerged map with at most one group per worker; the replica strategies keep their k
learners, Crossbow's statistical knob, and share the workers left), run the rest of the budget again
from that state, and record a `dask.recovery.Recovery` as the merged engine does. With `max_recoveries`
spent or no worker left: WorkerLostError naming the workers and their roles.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from dasknn.engine.dask.recovery import Recovery, WorkerLostError, is_worker_loss, lost_error, lost_workers
from dasknn.engine.dask.runs import cluster_workers, engine_client
from dasknn.engine.trace import Budget, RunConfig, RunResult, TrainState

Runner = Callable[..., RunResult]


def run_restarting(
    engine, runner: Runner, net, X, y, config: RunConfig, budget: Budget, start: TrainState | None, *,
    keep_groups: bool,
) -> RunResult:  # fmt: skip
    """`runner(engine, net, X, y, config, budget, start)`, run again from `start` on the workers left
    after each lost worker (up to `engine.max_recoveries` times); the Trace's `recovered` column and
    `attrs["recoveries"]` record it. `keep_groups`: n_groups stays (learners may share a worker)."""
    state0 = start.copy() if start is not None else TrainState.from_net(net)
    t0 = time.time()
    recoveries: list[Recovery] = []
    lost_all: dict[str, list[str]] = {}
    run_config, run_budget, t_restart = config, budget, t0
    while True:
        try:
            result = runner(engine, net, X, y, run_config, run_budget, state0.copy())
            break
        except Exception as err:
            if not (isinstance(err, WorkerLostError) or is_worker_loss(err)) or engine.placement_ is None:
                raise
            t_lost = time.time()
            placement = engine.placement_
            alive = cluster_workers(engine_client(engine))
            lost = lost_workers(placement, alive)
            deadline = t_lost + engine.timeout
            while not lost and time.time() < deadline:  # the scheduler may not have noticed yet
                time.sleep(0.2)
                alive = cluster_workers(engine_client(engine))
                lost = lost_workers(placement, alive)
            done = int(getattr(err, "updates", 0))
            if not lost:  # no worker of the run is gone: not a loss this runner can recover from
                if isinstance(err, WorkerLostError):
                    raise
                raise WorkerLostError(f"a worker of the run stopped answering: {err}") from err
            lost_all.update(lost)
            if engine.workers_seen_ is not None:  # the run again reports them as lost, not as left
                engine.workers_seen_ = engine.workers_seen_ - set(lost)
            if len(recoveries) >= engine.max_recoveries or not alive:
                raise lost_error(
                    lost_all, done, len(recoveries), engine.max_recoveries, alive, placement,
                    state0.iterations_done,
                ) from err  # fmt: skip
            before = run_config.n_groups
            after = before if keep_groups else max(1, min(before, len(alive)))
            run_config = run_config.with_(n_groups=after)
            if budget.seconds is not None:
                left = budget.seconds - (t_lost - t0)
                if left <= 0:
                    raise lost_error(
                        lost_all, done, len(recoveries), engine.max_recoveries, alive, placement,
                        state0.iterations_done,
                    ) from err  # fmt: skip
                run_budget = Budget(seconds=left, iterations=budget.iterations)
            t_restart = time.time()
            recoveries.append(
                Recovery(
                    time=t_lost - t0,
                    worker=", ".join(lost),
                    roles=sorted({r for roles in lost.values() for r in roles}),
                    iterations_redone=done,
                    n_groups_before=before,
                    n_groups_after=after,
                    from_snapshot=True,
                    snapshot_version=0,
                    seconds=t_restart - t_lost,
                )
            )
    trace = result.trace
    if recoveries:
        shift = t_restart - t0  # the time lost stays on the run's clock
        trace["t_start"] += shift
        trace["t_end"] += shift
        recoveries[-1].seconds += float(trace["t_start"].min() - shift) if len(trace) else 0.0
        recoveries[-1].placement = str(engine.placement_.roles())
    trace["recovered"] = bool(recoveries)
    trace.attrs["recoveries"] = [r.as_dict() for r in recoveries]
    return RunResult(trace=trace, state=result.state)
