"""The HE/SE tradeoff of Omnivore §IV: hardware and statistical efficiency models, experiment records."""

from .hardware import HEModel, phase_costs, t_parameter_server, t_reduction_tree, time_per_iteration
from .record import NETCDF_ENGINE, load, penalties, record_from_traces, save
from .statistical import (
    SMOOTHING_WINDOW,
    TARGET_LOSS_RULE,
    MomentumFit,
    async_sgd_least_squares,
    final_loss,
    fit_momentum,
    implicit_momentum,
    iterations_to_target,
    measure_implicit_momentum,
    smoothed_loss,
    target_loss,
)

__all__ = [
    "HEModel",
    "MomentumFit",
    "NETCDF_ENGINE",
    "SMOOTHING_WINDOW",
    "TARGET_LOSS_RULE",
    "async_sgd_least_squares",
    "final_loss",
    "fit_momentum",
    "implicit_momentum",
    "iterations_to_target",
    "load",
    "measure_implicit_momentum",
    "penalties",
    "phase_costs",
    "record_from_traces",
    "save",
    "smoothed_loss",
    "t_parameter_server",
    "t_reduction_tree",
    "target_loss",
    "time_per_iteration",
]
