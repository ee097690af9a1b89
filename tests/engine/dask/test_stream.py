"""DaskEngine(data="stream") on a real LocalCluster and a zarr store on disk: no chunk of X is
held by any worker, an epoch reads every sample once, and the weights equal persisted training's."""

from __future__ import annotations

import threading

import dask.array as da
import numpy as np
import pytest

from dasknn.data.stream import reset_stream_reads, stream_reads
from dasknn.engine.dask import DaskEngine
from dasknn.engine.trace import Budget, RunConfig
from dasknn.nn import zoo

CFG = RunConfig(n_groups=1, lr=0.01, momentum=0.9, weight_decay=5e-4, batch_size=64, seed=3)
N = 1792  # 28 batches of 64: an epoch drops no sample


@pytest.fixture(scope="module")
def zarr_digits(digits, tmp_path_factory):
    """The digits (28×28 float32) written to a zarr store in chunks of 256, read back lazily."""
    X, y = digits
    path = str(tmp_path_factory.mktemp("stream") / "digits.zarr")
    da.to_zarr(X[:N].rechunk((256, 1, 28, 28)), path)
    return da.from_zarr(path), y[:N].rechunk(256).compute()


class KeyWatch:
    """Polls the scheduler's who_has in a thread: every array chunk (a tuple key) any worker held."""

    def __init__(self, client) -> None:
        self.client, self.seen, self.polls = client, set(), 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for keys in self.client.has_what().values():
                self.seen.update(k for k in keys if isinstance(k, tuple))
            self.polls += 1
            self._stop.wait(0.05)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def reads(client, name: str) -> dict[str, np.ndarray]:
    """Samples delivered and chunks loaded for source `name`, summed over the workers."""
    total: dict[str, np.ndarray] = {}
    for counts in client.run(stream_reads, name).values():
        for what, c in counts.get(name, {}).items():
            total[what] = total.get(what, 0) + c
    return total


def test_streaming_holds_no_chunk_and_reads_each_sample_once_an_epoch(client2, zarr_digits):
    X, y = zarr_digits
    client2.run(reset_stream_reads)
    net = zoo.lenet(seed=0)
    engine = DaskEngine(client2, data="stream", shuffle_window=2)
    with KeyWatch(client2) as watch:
        result = engine.run(net, X, y, CFG, Budget(iterations=N // 64))
    assert watch.polls >= 3 and watch.seen == set()  # no chunk of X (nor of anything) persisted
    counts = reads(client2, X.name)
    np.testing.assert_array_equal(counts["samples"], np.ones(N, dtype=np.int64))
    np.testing.assert_array_equal(counts["chunks"], np.ones(N // 256, dtype=np.int64))
    assert result.state.batches_done == N // 64 and len(result.trace) == N // 64


def test_persisting_the_same_data_is_seen_by_the_watch(client2, zarr_digits):
    X, y = zarr_digits
    with KeyWatch(client2) as watch:
        DaskEngine(client2, data="persist").run(zoo.lenet(seed=0), X, y, CFG, Budget(iterations=4))
    assert any(key[0] == X.name or "from-zarr" in str(key[0]) for key in watch.seen)


def test_streamed_and_persisted_training_give_the_same_weights(client2, zarr_digits):
    X, y = zarr_digits
    nets = {}
    for mode in ("persist", "stream"):
        nets[mode] = zoo.lenet(seed=0)
        DaskEngine(client2, data=mode, shuffle_window=3).run(nets[mode], X, y, CFG, Budget(iterations=40))
    for k, v in nets["persist"].params.items():
        np.testing.assert_allclose(nets["stream"].params[k], v, rtol=1e-5, atol=1e-6, err_msg=k)


def test_several_groups_stream_their_own_batches(client2, zarr_digits):
    X, y = zarr_digits
    client2.run(reset_stream_reads)
    config = CFG.with_(n_groups=2)
    result = DaskEngine(client2, data="stream").run(zoo.lenet(seed=0), X, y, config, Budget(iterations=28))
    trace = result.trace
    assert sorted(trace["group"].unique()) == [0, 1] and sorted(trace["batch"]) == list(range(28))
    counts = reads(client2, X.name)
    np.testing.assert_array_equal(counts["samples"], np.ones(N, dtype=np.int64))  # the groups split it
    assert np.isfinite(trace["loss"]).all()


def test_streaming_is_refused_where_it_does_not_run():
    from dasknn.engine.strategy import Strategy

    with pytest.raises(ValueError, match="data='stream' runs on the merged map"):
        DaskEngine(None, data="stream", strategy=Strategy(name="sma"))
    with pytest.raises(ValueError, match="data must be one of"):
        DaskEngine(None, data="disk")


def test_an_imagefolder_of_jpegs_is_decoded_on_the_workers_and_trains(client2, tmp_path):
    from dasknn.data.images import imagefolder
    from tests.data.test_stream import write_jpegs

    write_jpegs(tmp_path, n_per_class=64, size=32)
    X, y = imagefolder(tmp_path, size=28, batch_size=32)  # uint8, decoded when a chunk is computed
    scaled = X.astype(np.float32) / 255
    client2.run(reset_stream_reads)
    net = zoo.lenet(input_shape=(3, 28, 28), num_classes=2, seed=0)
    config = CFG.with_(batch_size=32, n_groups=2, lr=0.01)
    result = DaskEngine(client2, data="stream").run(net, scaled, y, config, Budget(iterations=24))
    counts = reads(client2, scaled.name)
    np.testing.assert_array_equal(counts["samples"], np.full(128, 6))  # 24 batches of 32 = 6 epochs
    assert result.trace["accuracy"].tail(4).mean() >= 0.9  # bright vs dark: learnt in a few epochs


def test_a_fits_runs_share_one_scattered_source(client2, zarr_digits):
    """The trainer runs the engine once per evaluation interval: the source (X's graph and the
    labels) is read and scattered once, and every later run's loops get that one Future."""
    X, y = zarr_digits
    client2.run(reset_stream_reads)
    engine = DaskEngine(client2, data="stream")
    first = engine.run(zoo.lenet(seed=0), X, y, CFG, Budget(iterations=4))
    shipped = engine._stream_cache.data.shipped
    second = engine.run(zoo.lenet(seed=0), X, y, CFG, Budget(iterations=4), start=first.state)
    assert engine._stream_cache.data.shipped is shipped and shipped.status == "finished"
    assert second.state.batches_done == 8  # the second run went on from the first's batches
    counts = reads(client2, X.name)
    assert counts["samples"].sum() == 8 * 64
    other = DaskEngine(client2, data="stream")
    other.run(zoo.lenet(seed=0), X[: N // 2], y[: N // 2], CFG, Budget(iterations=1))
    assert other._stream_cache.data.shipped.key != shipped.key  # other data: its own source


def test_own_shard_reads_read_each_sample_once_and_train_the_lead_reads_weights(client2, zarr_digits):
    """shard_reads='own', one group on two workers: the lead and the shard server each stream their
    rows of every batch from the store; together they read every sample of the epoch once, each
    loads every chunk (the price of not sending shards between workers), and the weights equal
    those of the lead reading whole batches, augmentation included (a shard gets its rows' draws)."""
    from dasknn.data.augment import Augment

    X, y = zarr_digits
    nets = {}
    for reads in ("own", "lead"):
        client2.run(reset_stream_reads)
        nets[reads] = zoo.lenet(seed=0)
        engine = DaskEngine(
            client2, data="stream", shuffle_window=2, shard_reads=reads, augment=Augment(shift=2)
        )
        result = engine.run(nets[reads], X, y, CFG, Budget(iterations=N // 64))
        if reads == "own":
            assert len(engine.placement_.groups) == 1 and len(engine.placement_.groups[0]) == 2
            per_worker = [c.get(X.name) for c in client2.run(stream_reads).values()]
            samples = [c["samples"] for c in per_worker if c is not None]
            assert len(samples) == 2 and min(int(s.sum()) for s in samples) > 0  # both read
            np.testing.assert_array_equal(np.sum(samples, axis=0), np.ones(N, dtype=np.int64))
            chunks = np.sum([c["chunks"] for c in per_worker if c is not None], axis=0)
            np.testing.assert_array_equal(chunks, np.full(N // 256, 2))
            assert np.isfinite(result.trace["loss"]).all()
    for k, v in nets["lead"].params.items():
        np.testing.assert_allclose(nets["own"].params[k], v, rtol=1e-5, atol=1e-6, err_msg=k)
    with pytest.raises(ValueError, match="shard_reads must be one of"):
        DaskEngine(client2, data="stream", shard_reads="mine")


def test_freed_heap_memory_goes_back_to_the_os_on_glibc():
    """The group loops call glibc's malloc_trim every few seconds: 200 MB freed in holes of the heap
    come back to the OS with it; elsewhere the call says it cannot."""
    import platform

    import psutil

    from dasknn.engine.dask.tasks import release_freed_memory

    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        assert release_freed_memory() is False
        return
    process = psutil.Process()
    # 64 kB heap blocks (below glibc's mmap threshold), each followed by a 4 kB one that stays:
    # freeing the large ones leaves holes that free() cannot give back, only a trim can
    pairs = [(bytearray(64 * 1024), bytearray(4096)) for _ in range(3200)]
    peak = process.memory_info().rss
    pins = [small for _, small in pairs]
    del pairs
    assert release_freed_memory() is True
    assert process.memory_info().rss < peak - 100 * 2**20 and len(pins) == 3200
