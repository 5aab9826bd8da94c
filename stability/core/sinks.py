"""One interface for everything that consumes the run's records: ``StepSink``.

The run loop holds a list of named sinks and hands each ``StepLog`` to all of them with one
call (``on_step``), then each ``EpochLog`` (``on_epoch``). Every sink's state goes into the
resume checkpoint as ``{name: sink.state_dict()}`` and comes back through
``load_state_dict``: the PyTorch convention, so no one writes another object's attributes.

The sinks of a run, in the order they see a step (``core.assembly.standard_sinks``): ``layers``
(``LayerNormRecorder``, optional), ``diagnostics`` (``Diagnostics``: the run's and the epoch's
counts), ``csv`` (``CsvStepWriter``, rank 0), the caller's sinks (e.g. the MLflow
``MetricBuffer``), ``loss_init`` (our loop's), ``monitor`` (``SkipRateMonitor``, last: it may
end the run after the step is recorded everywhere).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from stability.core.steplog import EpochLog, StepLog


@runtime_checkable
class Stateful(Protocol):
    """Something a checkpoint saves and restores (``TrainStep``, every ``StepSink``)."""

    def state_dict(self) -> dict[str, Any]:
        """Plain containers and tensors only (the checkpoint loads with ``weights_only``)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a ``state_dict`` of the same kind of object."""
        ...


@runtime_checkable
class StepSink(Stateful, Protocol):
    """A consumer of the run's records, with resumable state."""

    def on_step(self, log: StepLog, epoch: int) -> None:
        """One optimizer step ended (taken or skipped)."""
        ...

    def on_epoch(self, log: EpochLog) -> None:
        """One epoch ended (after validation)."""
        ...


@runtime_checkable
class ParamSink(Protocol):
    """A sink that also takes params learnt once training has started: a trainer we do not
    own builds its optimizer and schedule itself, so what ran is known only then."""

    def on_params(self, params: Mapping[str, str]) -> None:
        """Record ``params`` as the run's (logged once; the same value again is harmless)."""
        ...


def state_of(sinks: Mapping[str, object]) -> dict[str, dict[str, Any]]:
    """``{name: state_dict()}`` of the sinks that have state (a plain callback may not)."""
    return {name: s.state_dict() for name, s in sinks.items() if isinstance(s, Stateful)}


def load_states(sinks: Mapping[str, object], states: Mapping[str, dict[str, Any]]) -> None:
    """Hand each sink its saved state (sinks absent from ``states`` start fresh)."""
    for name, s in sinks.items():
        if name in states and isinstance(s, Stateful):
            s.load_state_dict(states[name])
