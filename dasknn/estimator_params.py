"""DistributedCNN's parameters, declared once: name, rule (type and range), default, help.

The table `PARAMS` is the one place a parameter is described. The estimator's checks
(`check_params`), the command line's flags (`dasknn.cli` adds `add_flags` to `dasknn train`), the
estimator's docstring (`parameters_doc`) and the parameters a resumed fit must share
(`RESUME_PARAMS`) all come from it; scikit-learn still needs `DistributedCNN.__init__` to name each
parameter, and a test checks that the signature and the table agree. Follows scikit-learn:
`__init__` stores, `fit` calls `check_params` first, so bad options fail before any data is read
or any cluster is started (docs/architecture.md, "One table of parameters").
"""

from __future__ import annotations

import math
import numbers
import os
import re
from dataclasses import dataclass, replace
from typing import Any

from dasknn.rules import (
    ACCURACY,
    LEARNING_RATE,
    MOMENTUM,
    N_GROUPS,
    VERBOSE,
    Boolean,
    Choice,
    Custom,
    Number,
    Rule,
)

ENGINES = ("dask", "simulated")
KNOBS = ("n_groups", "learning_rate", "momentum")
"""Omnivore's knobs: the parameters a tuner chooses while training when they are "auto"."""
TUNERS = ("auto", "grid", "online")
"""The tuners of the knobs left "auto"."""
DATA_CHOICES = ("auto", "persist", "stream")
"""The values of DistributedCNN's `data`: the Dask engine's two ways of getting the training
batches to the workers (`dasknn.engine.dask.driver.DATA_MODES`), or "auto" to choose between them."""
STRATEGY_NAMES = ("omnivore", "sma", "model_averaging")
PHYSICAL_MAPS = ("merged", "unmerged")
AGGREGATIONS = ("tree", "ps")
HOOKS = ("on_fit_begin", "on_evaluation", "on_progress", "on_fit_end")
SIMULATED_GFLOPS = 50.0
"""Default SGEMM speed of a simulated device (GFLOP/s, about one core of a current server CPU)."""
SIMULATED_WORKERS = 8
"""Workers of the simulated cluster when `n_workers` is None (fewer when a batch is smaller:
`simulated_workers`)."""


@dataclass(frozen=True)
class Param:
    """One parameter of DistributedCNN.

    `rule` says what it accepts (type and range, `dasknn.rules`); `help` is its docstring entry
    (the command line shows its first sentence). `flag`: on `dasknn train` (its option is
    `--name-with-dashes`, plus `aliases`), with `cli_default` when the command's default differs
    from the estimator's. `resume`: a fit resumed from a checkpoint must share its value. `saved`:
    a saved model keeps it (`dasknn.saving`); False for paths, addresses, live objects and data,
    which a model folder never sets: they load as their defaults, for the user to set.
    """

    name: str
    default: Any
    rule: Rule
    help: str
    flag: bool = True
    aliases: tuple[str, ...] = ()
    cli_default: Any = ...
    resume: bool = True
    saved: bool = True

    @property
    def option(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def command_default(self) -> Any:
        return self.default if self.cli_default is ... else self.cli_default

    @property
    def cli_help(self) -> str:
        """The help of its option on `dasknn train`: `CLI_HELP`'s, else its help's first sentence in
        the command line's words, with its rule and default."""
        if self.name in CLI_HELP:
            text = CLI_HELP[self.name]
        else:
            text = _cli_words(_first_sentence(self.help))
            if not isinstance(self.rule, Boolean):
                text += f": {self.rule.what}"
        default = self.command_default
        if not isinstance(self.rule, Boolean) and default is not None and "(default:" not in text:
            text += f" (default {default})"
        return text

    def flag_type(self):
        """An argparse type: the word parsed and checked by the rule, with its error text."""
        import argparse

        def parse(text: str):
            value = self.rule.parse(text)
            try:
                return self.rule.check(self.name, value)
            except (ValueError, FileNotFoundError) as err:
                raise argparse.ArgumentTypeError(str(err)) from None

        parse.__name__ = self.name
        return parse


def _net_spec(spec) -> None:
    """The net is a Net, a zoo name or an existing .prototxt file: checked before any data is read."""
    from dasknn.nn.net import Net

    if isinstance(spec, Net):
        return
    if isinstance(spec, os.PathLike):
        spec = os.fspath(spec)
    if not isinstance(spec, str):
        raise ValueError(f"net must be a zoo name, a Net or a .prototxt path, got {spec!r}")
    if spec.endswith(".prototxt"):
        if not os.path.isfile(spec):
            raise FileNotFoundError(f"net: no such .prototxt file {spec!r}")
        return
    from dasknn.nn.zoo import NETS

    if spec.lower().replace("-", "_") not in NETS:
        raise ValueError(f"unknown net {spec!r}; available: {sorted(NETS)}")


def _input_shape(shape) -> bool:
    if shape is None or (isinstance(shape, str) and shape == "flat"):
        return True
    ok = isinstance(shape, (tuple, list)) and len(shape) == 3
    return ok and all(isinstance(s, numbers.Integral) and not isinstance(s, bool) and s >= 1 for s in shape)


def _checkpoint_dir(directory) -> None:
    """checkpoint_dir is a writable folder, or can be made one (checked before any training)."""
    if directory is None:
        return
    from pathlib import Path

    path = Path(directory).absolute()
    if path.exists() and not path.is_dir():
        raise ValueError(f"checkpoint_dir {os.fspath(directory)!r} exists and is not a directory")
    parent = path
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(
            f"checkpoint_dir {os.fspath(directory)!r} is not writable ({parent} does not let this user write)"
        )


def _security(value) -> bool:
    if value is None:
        return True
    from distributed.security import Security

    return isinstance(value, Security)


def _callbacks(cbs) -> None:
    if cbs is None:
        return
    for cb in cbs:
        if not any(callable(getattr(cb, hook, None)) for hook in HOOKS):
            raise ValueError(f"callback {cb!r} has none of the hooks {', '.join(HOOKS)}")


def _augment(value) -> None:
    from dasknn.data.augment import as_augment

    as_augment(value)


def _shuffle_window(value) -> None:
    from dasknn.data.batching import check_window

    try:
        check_window(value)
    except ValueError as err:
        raise ValueError(f"shuffle_window: {err}") from None


def _simulated_gflops_word(text: str):
    return text if text == "calibrate" else Number().parse(text)


def _none_word(text: str):
    return None if text == "none" else text


def _wall_time(value) -> bool:
    return value in ("auto", None) or Number(0, low_open=True).ok(value)


def _wall_time_word(text: str):
    return None if text.lower() == "none" else Number(0, low_open=True, also=("auto",)).parse(text)


def _is_tuner(value) -> bool:
    if isinstance(value, str):  # a name: no need to import the tuners (and scikit-learn) to check it
        return value in TUNERS
    from dasknn.optimizer.tuner import Tuner

    return isinstance(value, Tuner)


def _check_tuner(value) -> None:
    """A tuner object's options, each by its rule (`Tuner.checked`)."""
    if not isinstance(value, str):
        try:
            value.checked()
        except (TypeError, ValueError) as err:
            raise ValueError(f"tuner {value!r}: {err}") from None


def _optional_str(value) -> bool:
    return value is None or isinstance(value, str)


PARAMS: tuple[Param, ...] = (
    Param("net", "lenet", Custom("a zoo name, a Net or a .prototxt path", check_value=_net_spec),
          "A zoo name (\"lenet\", \"cifar10_quick\", \"cifar10_full\", \"caffenet\", \"mlp\", \"resnet20\"), "
          "a `Net` (copied, its weights are the start), or a Caffe `.prototxt` path."),
    Param("batch_size", 64, Number(1, integer=True), "Samples per iteration, summed over a group's workers."),
    Param("n_groups", "auto", replace(N_GROUPS, also=("auto",)),
          "Compute groups (Omnivore's g); \"auto\" lets the tuner choose."),
    Param("learning_rate", "auto", replace(LEARNING_RATE, also=("auto",)),
          "Learning rate η; \"auto\" lets the tuner choose.", aliases=("--lr",)),
    Param("momentum", "auto", replace(MOMENTUM, also=("auto",)),
          "Explicit momentum µ; \"auto\" lets the tuner choose."),
    Param("weight_decay", 5e-4, Number(0), "L2 weight decay (Caffe's)."),
    Param("time_budget", 120.0, Number(0, low_open=True, also=(None,)),
          "Seconds of training (simulated seconds with engine=\"simulated\"), the search included; "
          "a resumed fit may give a new one (counted from the start of the first fit).",
          cli_default=240.0, resume=False),
    Param("max_epochs", None, Number(0, low_open=True, also=(None,)),
          "Epochs of training at most; a resumed fit may give a new number.", resume=False),
    Param("max_wall_time", "auto",
          Custom("'auto', None or a number of seconds > 0", accepts=_wall_time, parse_text=_wall_time_word),
          "Real (wall-clock) seconds after which the fit stops at its next evaluation, keeping the model "
          "trained so far (`stopped_by_` says so). Meant for engine=\"simulated\", whose `time_budget` is "
          "simulated seconds: one machine computes them many times slower than the cluster it models "
          "runs them; the simulator checks the bound at every update. "
          "\"auto\": with engine=\"simulated\" and a time_budget, max(60, time_budget) real seconds; "
          "otherwise None (no bound: the Dask engine's time_budget is "
          "already wall-clock seconds). `max_wall_time_` is the value used. On the command line, none "
          "is None.", resume=False),
    Param("target_accuracy", None, replace(ACCURACY, also=(None,)),
          "Stop once the held-out accuracy (`val_accuracy`, on the validation data) reaches it; "
          "without validation data, once the training accuracy (the running mean of the iterations' "
          "batch accuracies since the last evaluation) does and the state scores it on 2,000 training "
          "samples drawn once (the history's `confirmed_accuracy`). "
          "A resumed fit may give a new one.",
          cli_default=0.96, resume=False),
    Param("engine", "dask", Choice(ENGINES), "Train on a Dask cluster, or on the simulator."),
    Param("scheduler", None, Custom("None or an address string", accepts=_optional_str),
          "Address of a running scheduler (tcp://host:8786); None uses the default client, or starts a "
          "LocalCluster.", resume=False, saved=False),
    Param("n_workers", None, Number(1, integer=True, also=(None,)),
          "Workers of the LocalCluster started when there is no client (default: one per core, at most 4), "
          "or of the simulated cluster (default 8, no more than its first compute groups can split a batch "
          "over)."),
    Param("worker_wait", None, Number(0, also=(None,)),
          "engine=\"dask\": seconds a run waits for a worker when the cluster has none at its start, or "
          "every worker of the run is retired (the servers' state waits in the driver) or lost (the "
          "recovery then waits), with a task pending so that an adaptive cluster "
          "(`cluster.adapt(minimum=0)`) starts one, rather than failing with WorkerLostError "
          "(`DaskEngine(worker_wait=...)`). None: the engine's timeout (120 s) when the client's cluster "
          "adapts down to zero workers, else no wait.", resume=False),
    Param("input_shape", None, Custom("None, 'flat' or (C, H, W) of positive integers", accepts=_input_shape),
          "None: X is 4-D (n, C, H, W). A tuple reshapes 2-D rows to images. \"flat\": each row's "
          "features are the channels of a 1×1 image (tabular data; use net=\"mlp\").", flag=False),
    Param("eval_size", None, Number(1, integer=True, also=(None,)),
          "Held-out samples scored at each evaluation: at most this many of the validation data, drawn "
          "once (seeded by `random_state`); None: all of it. No training sample is scored: `loss` and "
          "`accuracy` in the history are the running means of the iterations' own batch figures since "
          "the last evaluation. A resumed fit may give a new one.", resume=False),
    Param("validation_data", None,
          Custom("None or a pair (X_val, y_val)", accepts=lambda v: v is None or (
              isinstance(v, (tuple, list)) and len(v) == 2)),
          "Held-out data, never trained on: scored at every evaluation (all of it, or `eval_size` of it: "
          "`val_loss`, `val_accuracy`), the metric of `target_accuracy`, `report_` and early stopping. "
          "Checked like X.",
          flag=False, resume=False, saved=False),
    Param("validation_fraction", None, Number(0, 1, low_open=True, high_open=True, also=(None,)),
          "Instead of `validation_data`: this fraction of X, stratified and seeded by `random_state`, "
          "set aside before training (sklearn's `MLPClassifier` convention; `fit` only).", flag=False),
    Param("selection_size", 512, Number(0, integer=True),
          "Samples of X set aside (stratified, never trained on, disjoint from the validation data) on "
          "which the tuner judges its probes, at most a tenth of the rest of X; only when a knob is "
          "\"auto\". Held-out accuracy is then measured on data no choice was made on."),
    Param("early_stopping", False, Boolean(),
          "Stop when the held-out loss has not improved by more than `tol` for `n_iter_no_change` "
          "evaluations, and end with the best evaluation's weights (`dasknn.callbacks.EarlyStopping`). "
          "Without validation data it sets `validation_fraction` 0.1 aside, as sklearn does.", resume=False),
    Param("n_iter_no_change", 10, Number(1, integer=True),
          "Evaluations without improvement before early stopping stops.", resume=False),
    Param("tol", 1e-4, Number(0), "The improvement of the held-out loss early stopping counts.",
          resume=False),
    Param("callbacks", None,
          Custom("None or a list", accepts=lambda v: v is None or isinstance(v, (list, tuple)),
                 check_value=_callbacks),
          "Objects with any of `on_fit_begin(est)`, `on_evaluation(est, record)` (True stops the fit), "
          "`on_progress(est, info)` and `on_fit_end(est)`; see `dasknn.callbacks` (`ProgressBar`, "
          "`CSVLogger`, `EarlyStopping`, `ModelCheckpoint`).", flag=False, resume=False, saved=False),
    Param("strategy", "omnivore", Choice(STRATEGY_NAMES),
          "Omnivore's asynchronous compute groups (default), Crossbow's synchronous model averaging "
          "(n_groups learners), or SparkNet's model averaging every `tau` iterations."),
    Param("physical_map", "merged", Choice(PHYSICAL_MAPS),
          "FC compute and model on one server (merged, Omnivore), or FC compute on every conv worker with "
          "the FC model on a model server (unmerged: the MXNet/SINGA layout, Omnivore appendix C)."),
    Param("aggregation", "tree", Choice(AGGREGATIONS),
          "How a group sums its workers' gradients: a reduction tree (FireCaffe; among the workers' "
          "ShardServer actors on the Dask engine) or at one server (ps: the conv model server's worker, "
          "reached with tasks through the scheduler)."),
    Param("split", None, Custom("None, 'auto' or a layer name", accepts=_optional_str),
          "Where the FC phase starts: the first InnerProduct (None), RALP's rule (\"auto\"), or a layer."),
    Param("security", None, Custom("None or a distributed.security.Security", accepts=_security),
          "TLS settings for the client and any LocalCluster the fit starts (e.g. `Security.temporary()`).",
          flag=False, resume=False, saved=False),
    Param("random_state", 0, Number(0, 2**32, high_open=True, integer=True, text="in [0, 2**32)"),
          "Seed of the weights, the data's order and parts, dropout and augmentation.", aliases=("--seed",)),
    Param("verbose", 0, VERBOSE,
          "0: warnings only; 1: a progress bar (`dasknn.callbacks.ProgressBar`, on stderr) and INFO "
          "messages (the dashboard link of a cluster the fit starts, rollbacks); 2: also a line per "
          "evaluation and the tuner's decisions (DEBUG) and the engine's progress bars; 3: also the "
          "tuner's probes. Messages are `logging` records of the `dasknn` loggers, "
          "emitted whatever `verbose` is: with logging unconfigured, a fit with verbose >= 1 shows them on "
          "stderr from the matching level on.", flag=False, resume=False),
    Param("warm_start", False, Boolean(),
          "Continue from the previous fit's weights and data position (in memory, or else the latest "
          "checkpoint in `checkpoint_dir`) with a new budget.", flag=False, resume=False),
    Param("checkpoint_dir", None,
          Custom("None or a path", accepts=lambda v: v is None or isinstance(v, (str, os.PathLike)),
                 check_value=_checkpoint_dir),
          "Where the fit writes checkpoints: after every stretch of training "
          "that completes an epoch and at the end (the newest 3 are kept). A fresh fit needs it empty; "
          "`save_checkpoint()` writes one on request.", resume=False, saved=False),
    Param("resume", False, Boolean(),
          "Continue the fit whose latest checkpoint is in `checkpoint_dir` to that fit's own end (same "
          "budgets; on engine=\"simulated\" the result equals the uninterrupted fit). Without a checkpoint "
          "there, a fresh fit.", resume=False, saved=False),
    Param("tuner", "auto",
          Custom("one of 'auto', 'grid', 'online' or a tuner (AutoPolicy, GridPolicy, OnlinePolicy)",
                 accepts=_is_tuner, check_value=_check_tuner),
          "How the knobs left \"auto\" (n_groups, learning_rate, momentum) are chosen while training "
          "(the SGD update itself is always Caffe's momentum SGD). \"auto\": from the first iteration at "
          "a free prior (the HE model's g, the net's solver η and µ, or with prior_cache the last fit "
          "of the same job), "
          "η doubled while it pays, A-B-A trials within 5% of the elapsed time, η ÷ 3 on a plateau and a "
          "stop on convergence (`dasknn.optimizer.auto`). \"grid\": Omnivore's Algorithm 1, a cold "
          "start then grid searches from checkpoints. \"online\": the goodput tuner (Pollux, "
          "YellowFin, AdaScale; `dasknn.optimizer.online`). A name stands for its tuner at its defaults; a "
          "tuner object (`dasknn.optimizer.AutoPolicy(window=32)`, `GridPolicy(lr_grid=(0.1, 0.03, 0.01))`, "
          "`OnlinePolicy(...)`) sets its options, which `set_params(tuner__window=16)` and GridSearchCV "
          "reach; a fit works on a clone of it and never changes it. The knobs themselves, the target and "
          "verbose come from this estimator's parameters."),
    Param("prior_cache", False, Boolean(),
          "tuner=\"auto\": start from the configuration the last successful fit of the same net, data, "
          "batch size, input shape and weight decay ended with (a JSON file in the user's cache folder, "
          "$XDG_CACHE_HOME/dasknn or ~/.cache/dasknn; `$DASKNN_PRIOR_CACHE` names another file, or \"off\"), "
          "and record where this fit ends for the next. Off by default: a fit then depends only on its "
          "arguments, and a fixed random_state gives the same decisions every time.", resume=False),
    Param("simulated_gflops", SIMULATED_GFLOPS,
          Custom("a number > 0 or 'calibrate'", accepts=lambda v: (isinstance(v, str) and v == "calibrate")
                 or Number(0, low_open=True).ok(v), parse_text=_simulated_gflops_word),
          "engine=\"simulated\": the SGEMM speed (GFLOP/s) of each simulated device, from which the "
          "simulator's timing model (Omnivore's hardware efficiency model) is built. A number makes the "
          "simulated clock, and so "
          "the whole run, the same on any machine at any load. \"calibrate\" measures this machine once at "
          "the start of the fit; the value is recorded in `trace_.attrs[\"simulated_gflops\"]` and in every "
          "checkpoint, and a resumed fit reads it back."),
    Param("data", "auto", Choice(DATA_CHOICES),
          "engine=\"dask\": how the workers get the training batches. \"persist\" holds X in the workers' "
          "memory (the fast path); \"stream\" never persists it: each group's lead worker reads its "
          "batches from X's source (zarr chunks, files), a bounded number ahead, holding at most "
          "2·`shuffle_window` chunks; uint8 X stays uint8 until that worker "
          "converts it. \"auto\" streams when X as float32 exceeds half the workers' summed memory limits. "
          "Streaming runs Omnivore's merged map only. `data_` says which "
          "one the fit used.", resume=False),
    Param("augment", None,
          Custom("None, 'shift', 'crop_mirror:SIZE', a dict or an Augment", check_value=_augment,
                 parse_text=_none_word),
          "What the workers do to each training batch, drawn from (random_state, batch) so that runs and "
          "resumes see the same batches: \"shift\" moves digits by up to ±2 px (zero padded, no mirror); "
          "crop_size (random crop in training, centre crop when scoring and predicting: the net takes "
          "crop_size inputs) and mirror are Caffe's. None with a `.prototxt` net: its data layer's "
          "`transform_param { crop_size mirror }`. `augment_` is what the fit used. On the command line, "
          "none is None."),
    Param("shuffle_window", 1, Custom("an integer >= 1", check_value=_shuffle_window, parse_text=
                                      lambda t: Number(integer=True).parse(t)),
          "Chunks whose samples are shuffled together each epoch, after the chunks are permuted: "
          "1 shuffles within chunks; larger mixes more and makes a "
          "streaming reader hold more chunks."),
    Param("backend", None, Choice(("auto", "lowering", "onednn", None)),
          "The kernels of the conv phase and of the FC phase's inner products, set "
          "on every layer that has a choice: "
          "\"lowering\" is Caffe con Troll's batched lowering on numpy's BLAS (the reference); \"onednn\" "
          "calls oneDNN's direct convolutions (installed with dasknn on Linux x86-64); \"auto\" takes "
          "oneDNN for float32 on a "
          "CPU when it is installed and lowering elsewhere. None keeps the net's own setting (\"auto\" for "
          "zoo and .prototxt nets). A resumed fit must use the same kernels (their roundings differ)."),
    Param("averaging", "auto", Choice(("auto", "ema", None)),
          "The model a fit scores, returns and saves: the weights the servers train (None), or "
          "(\"ema\") an exponential moving average of them that the conv model server and the FC server "
          "keep beside them, updated at each update, its decay ramping up with the updates it took, "
          "min(0.999, (1 + t)/(10 + t)) (no horizon needed; `dasknn.engine.averaging`); \"auto\": "
          "\"ema\" where the servers keep one (Omnivore's compute groups on the merged map), None "
          "elsewhere. Training goes on from the weights; checkpoints and resumed fits carry both. Both "
          "engines; \"ema\" on Omnivore's compute groups on the merged map only."),
)  # fmt: skip
"""Every parameter of DistributedCNN, in `__init__`'s order."""

BY_NAME = {p.name: p for p in PARAMS}
RESUME_PARAMS = tuple(p.name for p in PARAMS if p.resume)
"""Parameters a resumed fit must share with the checkpointed one (`data` may differ: persisted and
streamed runs read the same batches)."""


def defaults() -> dict[str, Any]:
    """Each parameter's default, by name."""
    return {p.name: p.default for p in PARAMS}


def parameters_doc() -> str:
    """The numpydoc "Parameters" section of DistributedCNN, from the table."""
    import textwrap

    lines = ["Parameters", "----------"]
    for p in PARAMS:
        lines.append(f"{p.name} : {p.rule.what}, default {p.default!r}")
        lines.extend(textwrap.wrap(p.help, 96, initial_indent="    ", subsequent_indent="    "))
    return "\n".join(lines)


def optimizer_class(name: str):
    """The tuner class of a name of DistributedCNN's `tuner` parameter."""
    from dasknn.optimizer import AutoPolicy, GridPolicy, OnlinePolicy

    return {"auto": AutoPolicy, "online": OnlinePolicy, "grid": GridPolicy}[name]


def tuner_name(tuner) -> str:
    """The name of DistributedCNN's `tuner` parameter: the name given, or the tuner object's."""
    return tuner if isinstance(tuner, str) else tuner.name


def tuner_object(tuner):
    """The tuner of DistributedCNN's `tuner` parameter: the object given, or the named one at its
    defaults."""
    return optimizer_class(tuner)() if isinstance(tuner, str) else tuner


def tunes(params: dict[str, Any]) -> bool:
    """Whether a tuner chooses a knob: one of `KNOBS` is left "auto"."""
    return any(params[knob] == "auto" for knob in KNOBS)


def check_params(params: dict[str, Any], partial: bool = False) -> None:
    """Every DistributedCNN parameter checked by its rule, then the combinations, each error naming
    the parameter, before any data is touched. `params`: the estimator's `get_params(deep=False)`."""
    for p in PARAMS:
        p.rule.check(p.name, params[p.name])
    _check_combinations(params, partial)


def _check_combinations(params: dict[str, Any], partial: bool) -> None:
    """The rules that span parameters."""
    if params["time_budget"] is None and params["max_epochs"] is None and not partial:
        raise ValueError("give time_budget or max_epochs (or both): training needs an end")
    if params["validation_data"] is not None and params["validation_fraction"] is not None:
        raise ValueError("give validation_data or validation_fraction, not both")
    if params["resume"] and params["checkpoint_dir"] is None:
        raise ValueError("resume=True needs checkpoint_dir (where the checkpoints are)")
    from dasknn.engine.strategy import Strategy

    Strategy(
        name=params["strategy"],
        physical_map=params["physical_map"],
        aggregation=params["aggregation"],
        split=params["split"],
    )
    _check_tls(params["scheduler"], params["security"])
    _check_data(params)
    if params["averaging"] == "ema" and not merged(params["strategy"], params["physical_map"]):
        raise ValueError(
            f"averaging={params['averaging']!r} runs on Omnivore's compute groups: strategy='omnivore' "
            f"and physical_map='merged'; got strategy={params['strategy']!r}, "
            f"physical_map={params['physical_map']!r}"
        )
    n_groups, n_workers = params["n_groups"], params["n_workers"] or SIMULATED_WORKERS
    if params["engine"] == "simulated" and n_groups != "auto" and int(n_groups) > n_workers:
        raise ValueError(
            f"n_groups={n_groups} needs at least that many workers; the simulated cluster has "
            f"n_workers={n_workers}"
        )


def merged(strategy: Any, physical_map: str) -> bool:
    """Omnivore's compute groups on the merged map: the layout whose groups stream and augment their
    batches, and whose servers keep a weight average."""
    return strategy == "omnivore" and physical_map == "merged"


def engine_averaging(params: dict[str, Any], start=None) -> str | None:
    """The weight average the engine keeps (`engine.averaging`): `averaging`, with "auto" the EMA
    where the servers keep one (Omnivore's compute groups on the merged map) and None elsewhere,
    or where the fit goes on from a `start` state that trained without one (a checkpoint written
    before averaging, or by a fit without it: it resumes as it ran)."""
    if params["averaging"] != "auto":
        return params["averaging"]
    groups = merged(params["strategy"], params["physical_map"])
    trained = start is not None and getattr(start, "iterations_done", 0) > 0
    if trained and "averaging" not in getattr(start, "extra", {}):
        return None
    return "ema" if groups else None


def simulated_workers(n_workers: int | None, n_groups, batch_size: int) -> int:
    """The simulated cluster's workers: `n_workers`, else `SIMULATED_WORKERS`, but never more than
    its compute groups can split a batch over (one group for "auto" n_groups: the cold start)."""
    if n_workers is not None:
        return int(n_workers)
    groups = 1 if n_groups == "auto" else int(n_groups)
    return min(SIMULATED_WORKERS, groups * int(batch_size))


def check_batch_split(n_workers: int, n_groups, batch_size: int) -> None:
    """A compute group splits each batch over its workers (Omnivore §III-B): refused, naming the
    parameters to change, when a group ("auto": the cold start's one) has more workers than the
    batch has samples."""
    groups = 1 if n_groups == "auto" else int(n_groups)
    per_group = int(n_workers) // groups
    if per_group > batch_size:
        raise ValueError(
            f"batch_size={batch_size} cannot be split over the {per_group} workers of a compute group "
            f"(n_workers={n_workers}, n_groups={n_groups!r}): give batch_size >= {per_group}, "
            f"n_groups >= {math.ceil(int(n_workers) / batch_size)} or n_workers <= {groups * batch_size}"
        )


def _check_data(params: dict[str, Any]) -> None:
    """The layouts that can stream and augment."""
    data, engine, augment = params["data"], params["engine"], params["augment"]
    if data == "stream" and engine != "dask":
        raise ValueError("data='stream' needs engine='dask' (the simulator holds X in memory)")
    merged = params["strategy"] == "omnivore" and params["physical_map"] == "merged"
    from dasknn.data.augment import as_augment

    if engine == "dask" and not merged and (data == "stream" or as_augment(augment) is not None):
        what = "data='stream'" if data == "stream" else f"augment={augment!r}"
        raise ValueError(
            f"{what} runs on Omnivore's merged map on the Dask engine; strategy={params['strategy']!r} with "
            f"physical_map={params['physical_map']!r} reads persisted, unaugmented batches"
        )


def _check_tls(scheduler, security) -> None:
    """A tls:// scheduler needs credentials: from `security`, else the dask config's."""
    if not (isinstance(scheduler, str) and scheduler.startswith("tls://")):
        return
    from distributed.security import Security

    security = security if security is not None else Security()
    if not security.tls_ca_file:
        raise ValueError(
            f"scheduler {scheduler} speaks TLS but no TLS credentials are given: pass "
            "`dasknn train --tls-ca-file --tls-cert --tls-key`, or "
            "security=Security(tls_ca_file=..., tls_client_cert=..., tls_client_key=...), or set "
            "distributed.comm.tls.{ca-file,client.cert,client.key} in the dask config"
        )


# -- the command line ---------------------------------------------------------------------------


def _first_sentence(text: str) -> str:
    head, _, _ = text.partition(". ")
    return head.rstrip(".")


CLI_HELP = {
    "net": 'A zoo net ("lenet", "cifar10_quick", "cifar10_full", "caffenet", "mlp", "resnet20") or the '
    "path of a Caffe .prototxt file",
    "max_epochs": "Epochs of training at most: a number > 0 (default: no limit; --time-budget ends the fit)",
    "max_wall_time": "Real (wall-clock) seconds after which the fit stops at its next evaluation, keeping "
    "the model trained so far: a number > 0, 'auto' (with --engine simulated: the time budget, at least "
    "60 s; else no limit) or None (no limit)",
    "scheduler": "Address of a running Dask scheduler, e.g. tcp://host:8786 (default: a LocalCluster "
    "started for the run)",
    "n_workers": "Workers of the LocalCluster started for the run, or of the simulated cluster (default: "
    "one per core, at most 4; simulated: 8, no more than a batch can be split over)",
    "worker_wait": "--engine dask: seconds a run waits for a worker when the cluster has none or has "
    "lost them all (an adaptive cluster starting one) before failing: a number >= 0 (default: 120 s "
    "when the cluster adapts down to zero workers, else no wait)",
    "split": "Where the FC phase starts: a layer name of the net (dasknn summary NET lists them) or "
    "'auto' (RALP's rule) (default: the first InnerProduct layer)",
    "checkpoint_dir": "Folder for checkpoints, written after each epoch and at the end, the newest 3 kept "
    "(default: none written)",
    "augment": "What the workers do to each training batch: 'shift' (digits moved by up to 2 px) or "
    "'crop_mirror:SIZE' (Caffe's random crop of SIZE and mirror) (default: none)",
    "backend": "The conv and FC kernels: 'lowering' (batched lowering on numpy's BLAS, the reference), "
    "'onednn' (oneDNN's direct convolutions, installed with dasknn on Linux x86-64) or 'auto' "
    "(oneDNN for float32 on a CPU when "
    "installed, else lowering) (default: the net's own, 'auto' for zoo and .prototxt nets)",
    "early_stopping": "Stop when the held-out loss has not improved by more than --tol for "
    "--n-iter-no-change evaluations, ending with the best evaluation's weights",
    "resume": "Continue the fit whose latest checkpoint is in --checkpoint-dir to that fit's own end",
    "tuner": "How the knobs left 'auto' (--n-groups, --learning-rate, --momentum) are chosen while training: "
    "'auto', 'grid' (Omnivore's Algorithm 1; --lr-grid sets its rates) or 'online'",
}
"""`dasknn train --help`'s wording where the docstring's does not fit a command line (Python objects,
what leaving an option out means); the other options' help is the docstring's first sentence."""


def _cli_words(text: str) -> str:
    """A docstring sentence in a command line's words: parameters as their options, engine="x" as
    --engine x, no backquotes, no module paths in parentheses."""
    options = {p.name: p.option for p in PARAMS if p.flag}
    text = re.sub(r'engine="(\w+)"', r"--engine \1", text)
    text = re.sub(r" \(`dasknn\.[\w.]+`\)", "", text)
    text = re.sub(r"`(\w+)`", lambda m: options.get(m.group(1), m.group(1)), text)
    return text.replace("`", "")


def add_flags(parser) -> None:
    """The table's parameters with `flag` as options of `parser` (`dasknn train`), dest = the name."""
    for p in PARAMS:
        if not p.flag:
            continue
        names = (p.option, *p.aliases)
        default = p.command_default
        if isinstance(p.rule, Boolean):
            parser.add_argument(*names, dest=p.name, action="store_true", help=p.cli_help)
            continue
        metavar = "{" + ",".join(map(str, p.rule.values)) + "}" if isinstance(p.rule, Choice) else None
        parser.add_argument(
            *names,
            dest=p.name,
            type=p.flag_type(),
            default=default,
            metavar=metavar,
            help=p.cli_help,
        )


def flag_values(args) -> dict[str, Any]:
    """The estimator's parameters given on the command line (every flag of the table)."""
    return {p.name: getattr(args, p.name) for p in PARAMS if p.flag}
