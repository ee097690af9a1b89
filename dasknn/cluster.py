"""The cluster a fit runs on: where its Dask client comes from, and whether its scheduler still answers.

A fit gets its client at fit time, never in `__init__` (dask-ml's rule): the scheduler given
(`connect`), the worker's own client when the fit runs inside a task (`worker_client`), the default
client, else a LocalCluster of its own (worker threads where a nanny cannot start processes).
`dasknn train` starts that LocalCluster itself, ahead of the fit (`ClusterAhead`), so the cluster
and its workers' imports start while the command goes on with its own set-up.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import weakref
from contextlib import ExitStack
from pathlib import Path

import dask

__all__ = [
    "WARM_MODULES",
    "ClusterAhead",
    "announce",
    "connect",
    "dask_client",
    "in_daemon_process",
    "in_dask_task",
    "scheduler_answers",
    "scheduler_lost",
    "unguarded",
    "unguarded_script",
]

logger = logging.getLogger(__name__)


def dask_client(stack: ExitStack, scheduler: str | None, security, n_workers: int | None):
    """The fit's client (its lifetime tied to `stack`): the scheduler at `scheduler`, the task's
    worker_client, the default client, else a LocalCluster of `n_workers` started for this fit."""
    from distributed import default_client

    from dasknn.engine.dask import local_client

    if scheduler is not None:
        client = stack.enter_context(connect(scheduler, security))
        stack.enter_context(closed_on_loss(client))
        return client
    if in_dask_task():
        from distributed import worker_client

        # a fit inside a task (client.submit, joblib's dask backend, dask-ml): the task secedes
        # from its worker's thread pool while it waits, so the run's own tasks and actors get it
        return stack.enter_context(worker_client())
    try:
        return default_client()
    except ValueError:
        # inside joblib's or multiprocessing's workers (n_jobs > 1) a nanny cannot start
        # worker processes, nor from a script's top level that each of them would run again:
        # the LocalCluster runs its workers as threads there; a free port for the scheduler's
        # HTTP server (the dashboard when bokeh is installed)
        threads = in_daemon_process() or unguarded_script()
        client = stack.enter_context(
            local_client(
                n_workers=n_workers, security=security, processes=not threads, dashboard_address=":0"
            )
        )
        announce(client)
        return client


def announce(client) -> None:
    """A message (INFO: shown from verbose=1) naming the cluster a fit started and its dashboard link.

    dasknn does not depend on bokeh, which dask's dashboard needs: most dask users have it, and
    it brings a web stack a training library need not impose; without it the line says how to get
    the dashboard."""
    import importlib.util

    workers = len(client.scheduler_info().get("workers", {}))
    if importlib.util.find_spec("bokeh") is not None:
        where = f"dashboard {client.dashboard_link}"
    else:
        where = "no dashboard: pip install bokeh to get one"
    logger.info("started a LocalCluster of %d workers (%s)", workers, where)


def in_dask_task() -> bool:
    """True when called from a task running on a dask worker."""
    from distributed import get_worker

    try:
        get_worker()
    except ValueError:
        return False
    return True


def in_daemon_process() -> bool:
    """True where a nanny cannot start worker processes: a daemonic process (multiprocessing pools),
    or one whose start method is not the standard library's (joblib's loky workers set 'loky')."""
    import multiprocessing

    method = multiprocessing.get_start_method(allow_none=True)
    standard = method is None or method in multiprocessing.get_all_start_methods()
    return bool(multiprocessing.current_process().daemon) or not standard


def unguarded_script() -> bool:
    """True (after a warning line saying what to add) when this call runs at the top level of the
    main script, outside `if __name__ == "__main__":`, and dask starts worker processes with spawn
    or forkserver: each worker process imports the main script again (multiprocessing's rule), so
    it would start a cluster of its own, which fails while the process is starting."""
    import multiprocessing
    import sys

    if dask.config.get("distributed.worker.multiprocessing-method", "spawn") == "fork":
        return False
    if multiprocessing.parent_process() is not None:
        return False  # a worker's own process: its parent decided (`in_daemon_process`)
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    spec = getattr(main, "__spec__", None)
    if path is None or (spec is not None and spec.name.endswith(".__main__")):
        return False  # an interactive session or a package's __main__: not imported again
    frame = sys._getframe(1)
    while frame is not None and not (frame.f_globals is vars(main) and frame.f_code.co_name == "<module>"):
        frame = frame.f_back
    if frame is None:
        return False
    try:
        source = Path(path).read_text()
    except (OSError, UnicodeDecodeError):
        return False
    if not unguarded(source, frame.f_lineno):
        return False
    logger.warning(
        f"{path} starts a LocalCluster at its top level (line {frame.f_lineno}), which every worker "
        'process runs again: put that code under `if __name__ == "__main__":` to train on worker '
        "processes; this fit runs its workers as threads"
    )
    return True


def unguarded(source: str, lineno: int) -> bool:
    """True when line `lineno` of a script's `source` runs on import: it is in a top-level
    statement other than `if __name__ == "__main__":`."""
    import ast

    try:
        body = ast.parse(source).body
    except SyntaxError:
        return False
    for stmt in body:
        if stmt.lineno <= lineno <= (stmt.end_lineno or stmt.lineno):
            return not (isinstance(stmt, ast.If) and _is_main_test(stmt.test))
    return False


def _is_main_test(test) -> bool:
    """`__name__ == "__main__"` (either way round)."""
    import ast

    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    names = [s.id for s in sides if isinstance(s, ast.Name)]
    values = [s.value for s in sides if isinstance(s, ast.Constant)]
    return names == ["__name__"] and values == ["__main__"]


def connect(address: str, security):
    """A Client of the scheduler at `address`; SchedulerError (naming it) if it cannot be reached
    within `distributed.comm.timeouts.connect` (`dasknn train --connect-timeout`)."""
    from distributed import Client

    from dasknn.engine.dask.recovery import SchedulerError

    timeout = dask.config.get("distributed.comm.timeouts.connect")
    try:
        return Client(address, security=security)
    except (OSError, TimeoutError) as err:
        raise SchedulerError(
            f"cannot reach the scheduler at {address} within {timeout} ({type(err).__name__}: {err}); "
            "check that `dask scheduler` runs there and that the address, port and TLS settings are right"
        ) from err


_CLOSED_ON_LOSS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""client → the address of the scheduler it lost (`closed_on_loss`), which its close forgets."""


@contextlib.contextmanager
def closed_on_loss(client, poll: float = 0.2):
    """Close `client` as soon as it loses its scheduler, while the block runs.

    A client that loses its scheduler cancels its futures, but a call that opens a connection to
    the scheduler (`client.run`, `scatter`, `identity`) retries it for the whole reconnection window
    (`distributed.comm.timeouts.connect`, `dasknn train --connect-timeout`) before failing. A fit
    cannot go on without its scheduler (the scheduler holds its tasks and actors), so for a client
    dasknn connected itself such a call should fail at once: closing the client cancels the
    pending connections. A client the user passed is not closed behind their back."""
    from dasknn.engine.dask.recovery import scheduler_connected

    done = threading.Event()
    address = client.scheduler.address

    def watch() -> None:
        while not done.wait(poll):
            if client.status in ("closing", "closed"):
                return
            if not scheduler_connected(client):
                logger.debug("the client lost its scheduler at %s: closing it", address)
                _CLOSED_ON_LOSS[client] = address
                with contextlib.suppress(Exception):
                    client.close(timeout=10)
                return

    thread = threading.Thread(target=watch, name="dasknn-scheduler-watch", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def scheduler_answers(client, timeout: float = 10.0) -> bool:
    """True when the client's scheduler still answers (a bounded identity call)."""
    from dasknn.engine.dask.recovery import scheduler_connected

    if not scheduler_connected(client):
        return False
    try:
        client.sync(client.scheduler.identity, callback_timeout=timeout)
    except Exception:
        return False
    return True


def scheduler_lost(client, err: BaseException):
    from dasknn.engine.dask.recovery import SchedulerError

    address = (
        _CLOSED_ON_LOSS.get(client) or getattr(client.scheduler, "address", None) or "the client's address"
    )
    return SchedulerError(
        f"lost the scheduler at {address} during the fit ({type(err).__name__}: {err}); restart "
        "`dask scheduler` and its workers, then resume from the last checkpoint (checkpoint_dir, resume=True)"
    )


WARM_MODULES = (
    "distributed",
    "dask.array",
    "dasknn.engine.dask.tasks",
    "dasknn.engine.dask.iteration",
    "dasknn.estimator_data",
)
"""What a fit's worker process imports before its first iteration (distributed; dask.array and what
it brings, scipy and pandas among them; the worker side of the Dask engine): a `ClusterAhead`'s
fork server imports them once, before any worker exists, and every worker is forked from it."""


def start_forkserver(n_workers: int | None) -> bool:
    """Start multiprocessing's fork server now, importing `WARM_MODULES`, with the environment of
    the workers of a LocalCluster of `n_workers` (`engine.dask.environ`: BLAS threads, malloc
    thresholds, hash seed); False where the platform has no fork server.

    The fork server is a process of its own: its imports run on another core while this process
    goes on, and each worker forked from it starts with them done, rather than every spawned
    worker importing them again. The environment is this process's again once the server runs."""
    import multiprocessing
    import os
    from multiprocessing import forkserver

    from dasknn.backend import cpu_cores
    from dasknn.engine.dask.environ import HASH_SEED, local_workers, worker_environ

    if "forkserver" not in multiprocessing.get_all_start_methods():
        return False
    cores = cpu_cores()
    env = {**worker_environ(local_workers(n_workers, cores), cores), "PYTHONHASHSEED": HASH_SEED}
    multiprocessing.get_context("forkserver").set_forkserver_preload(list(WARM_MODULES))
    before = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        forkserver.ensure_running()
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return True


def _import(names: tuple[str, ...]) -> None:
    import importlib

    for name in names:
        importlib.import_module(name)


def stop_forkserver() -> None:
    """End the fork server `start_forkserver` started, once no worker of it is left: at once, not
    through its interpreter's teardown of the modules it imported, which would run after the
    command's end, holding its output open. multiprocessing has no public call for this; `_stop`
    is the one its own tests use (it closes the server's pipe, waits for it and forgets it)."""
    import os
    import signal
    from multiprocessing import forkserver

    server = forkserver._forkserver
    if server._forkserver_pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(server._forkserver_pid, signal.SIGTERM)
    server._stop()


class ClusterAhead:
    """The LocalCluster a fit would start (`dask_client`'s last case), started on a thread now, so
    that the scheduler and the workers start (forked from a fork server that imports
    `WARM_MODULES` once: `start_forkserver`), while this process goes on with what comes before
    the fit (`dasknn train` imports the estimator, reads the data and checks it meanwhile). Its
    Client becomes the default client, which the fit then uses.

    `client()` waits for the start (raising what it raised); `close_behind()` closes the cluster on
    a thread, while the caller writes its report; leaving the `with` block waits for the close (and
    closes a cluster still open, on an error). `wanted(scheduler, engine, security)`: whether a fit
    with these parameters would start a LocalCluster of processes."""

    def __init__(self, n_workers: int | None) -> None:
        workers = "as many workers as the machine has cores" if n_workers is None else f"{n_workers} workers"
        logger.debug("starting a LocalCluster of %s ahead of the fit", workers)
        self._stack = ExitStack()
        self._client = None
        self._error: BaseException | None = None
        self._start = threading.Thread(
            target=self._started, args=(n_workers,), name="dasknn-cluster-start", daemon=True
        )
        self._closing: threading.Thread | None = None
        self._forked = start_forkserver(n_workers)
        self._start.start()

    @staticmethod
    def wanted(scheduler, engine: str, security) -> bool:
        import sys

        if scheduler is not None or engine != "dask" or security is not None:
            return False
        if in_daemon_process():
            return False
        if "distributed" not in sys.modules:
            return True  # nothing of distributed's runs in this process: no task, no default client
        from distributed import default_client

        if in_dask_task():
            return False
        try:
            default_client()
        except ValueError:
            return True
        return False

    def _started(self, n_workers: int | None) -> None:
        from dasknn.engine.dask import local_client

        try:
            if self._forked:
                # every worker of the cluster (those it restarts or adds later too) comes from the
                # fork server, which ends once the cluster has closed
                self._stack.callback(stop_forkserver)
                self._stack.enter_context(
                    dask.config.set({"distributed.worker.multiprocessing-method": "forkserver"})
                )
            client = self._stack.enter_context(local_client(n_workers=n_workers, dashboard_address=":0"))
            if not self._forked:  # a forked worker has them from the fork server
                client.run(_import, WARM_MODULES)
            self._client = client
        except BaseException as err:  # raised again in the caller's thread by client()
            self._error = err

    def ready(self) -> bool:
        """Whether the start is over (`client()` would not wait)."""
        return not self._start.is_alive()

    def client(self):
        """The started cluster's Client (waits for the start)."""
        self._start.join()
        if self._error is not None:
            raise self._error
        return self._client

    def close_behind(self) -> None:
        """Close the cluster on a thread (the `with` block's end waits for it)."""
        self._start.join()
        if self._closing is None:
            self._closing = threading.Thread(target=self._close, name="dasknn-cluster-close", daemon=True)
            self._closing.start()

    def _close(self) -> None:
        try:
            self._stack.close()
        except BaseException as err:  # raised again by the `with` block's end
            self._error = self._error or err

    def __enter__(self) -> ClusterAhead:
        return self

    def __exit__(self, kind, value, traceback) -> None:
        self.close_behind()
        self._closing.join()
        if kind is None and self._error is not None:
            raise self._error
