"""What may be built from a recorded config: an allow-listed task, a config matching its tag.

The report rebuilds its winner through it (``report/evidence/trust.py`` names the same functions),
and a sweep checks a FINISHED run with it before adopting it (``tracking/adoption.py``).

A run's ``config.yaml`` is data anyone with write access to the experiment could have written.
Rebuilding the winner calls the class ``task._target_`` names, so before anything is imported
or built: no interpolation (``${...}``: OmegaConf's resolvers, ``oc.create`` among them) may
appear in any key or value but our own ``task.data: ${data}`` / ``task.model: ${model}``; the
target must be one of the built-in tasks or the one the user named on the report's command
line (``task_target=<import path>``); no other Hydra key (``_target_``, ``_partial_``,
``_args_``, ``_recursive_``, ``_convert_``) may appear anywhere in the file but the
optimizer's and the schedule's targets, which must name PyTorch's own (``torch.optim.*``,
``torch.optim.lr_scheduler.*``) or the built-in schedules; and the config must hash to the
run's ``stability.fingerprint`` tag; and no size in ``data``, ``model`` or the task's
options may exceed a documented cap (``MAX_RECORDED_SIZE``, ``MAX_DATA_ELEMENTS``).
``core.task.build_task`` then calls the class with the plain values: no recursive
``instantiate`` of recorded content. The model is built on the ``meta`` device and compared
with the checkpoint before any memory is allocated (``report/sealed/evaluate.py``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from stability.core.config import DEFAULT_TASK, TASK_SECTIONS, RunConfig, to_run_config
from stability.core.identity import fingerprint
from stability.core.optim import LINEAR_WARMUP, WARMUP_COSINE

BUILTIN_TASKS = (DEFAULT_TASK, "stability.tasks.adding.AddingTask",
                 "stability.tasks.char_lm.CharLMTask")
HYDRA_KEYS = ("_target_", "_partial_", "_args_", "_recursive_", "_convert_")
# What optim/schedule may name in a recorded config: checked as strings, before any import.
TRUSTED_OPTIM = "torch.optim."
TRUSTED_SCHEDULES = (LINEAR_WARMUP, WARMUP_COSINE)
TRUSTED_SCHEDULE_PREFIX = "torch.optim.lr_scheduler."


def _trusted_target(key: str, value: Any) -> bool:
    if not isinstance(value, str) or not value.replace(".", "").replace("_", "").isalnum():
        return value is None and key == "schedule._target_"
    if key == "optim._target_":
        return value.startswith(TRUSTED_OPTIM) and value.count(".") == 2
    return value in TRUSTED_SCHEDULES or (value.startswith(TRUSTED_SCHEDULE_PREFIX)
                                          and value.count(".") == 3)


# What a recorded config may make the report allocate (docs/report.md): every number in the
# sections a task is built from (data, model, the task's options) but a seed, and the data's
# samples x sequence length. The default study's largest are 3000 samples and length 30.
MAX_RECORDED_SIZE = 1_000_000
MAX_DATA_ELEMENTS = 100_000_000
SIZED_SECTIONS = ("data", "model", "task")
# Bytes a built-in task allocates per data element (num_samples x seq_len) while it builds its
# data, before any checkpoint is compared: char_lm's corpus, ids and windows, and its one-hot
# targets over 28 characters (int64, then float32): ~361 bytes, 35 GB at MAX_DATA_ELEMENTS.
DATA_BYTES_PER_ELEMENT = {"stability.tasks.char_lm.CharLMTask": 400}
MAX_DATA_BYTES = 4 * 2**30


def _sizes(value: Any, prefix: str) -> Iterator[tuple[str, float]]:
    if isinstance(value, Mapping):
        for k, v in value.items():
            if not str(k).endswith("seed"):  # a seed picks data, it sizes nothing
                yield from _sizes(v, f"{prefix}.{k}")
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            yield from _sizes(v, f"{prefix}[{i}]")
    elif isinstance(value, int | float) and not isinstance(value, bool):
        yield prefix, value


def _check_sizes(raw: Mapping[str, Any]) -> None:
    for section in SIZED_SECTIONS:
        for key, value in _sizes(raw.get(section), section):
            if not abs(value) <= MAX_RECORDED_SIZE:  # nan fails too
                raise Untrusted(f"{key}={value!r} is over the report's cap: allowed values are "
                                f"at most {MAX_RECORDED_SIZE:,} (a recorded size is data; "
                                "docs/report.md)")
    data = raw.get("data")
    if isinstance(data, Mapping):
        n, length = data.get("num_samples"), data.get("seq_len")
        if isinstance(n, int) and isinstance(length, int) and n * length > MAX_DATA_ELEMENTS:
            raise Untrusted(f"data.num_samples={n} x data.seq_len={length} is over the report's "
                            f"cap: allowed values are at most {MAX_DATA_ELEMENTS:,} elements")
        task = raw.get("task")
        per = DATA_BYTES_PER_ELEMENT.get(task.get("_target_") if isinstance(task, Mapping)
                                         else None, 0)
        if isinstance(n, int) and isinstance(length, int) and n * length * per > MAX_DATA_BYTES:
            raise Untrusted(f"data.num_samples={n} x data.seq_len={length} is over the report's "
                            f"cap for {task['_target_']}: it allocates ~{per} bytes an element, "
                            f"allowed are at most {MAX_DATA_BYTES // per:,} elements")


class Untrusted(ValueError):
    """A run's recorded config may not be rebuilt (the reason names the key)."""


MAX_CONFIG_BYTES = 1_000_000  # a config.yaml of ours is ~1 kB


def _no_aliases() -> type:
    import yaml

    class NoAliases(yaml.SafeLoader):
        """PyYAML's safe loader, refusing an anchor or alias before it is composed: nine
        levels of ten aliases are a 450-byte file that a tree walk visits 10^9 times."""

        def compose_node(self, parent: Any, index: Any) -> Any:
            event = self.peek_event()
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
                raise Untrusted(f"config.yaml holds a YAML anchor or alias (&/*{event.anchor}) "
                                f"at line {event.start_mark.line + 1}: a recorded config is "
                                "plain data, written without anchors or aliases")
            return super().compose_node(parent, index)

    return NoAliases


def read_recorded(path: Any) -> Any:
    """A recorded ``config.yaml`` as plain data: at most ``MAX_CONFIG_BYTES``, UTF-8, YAML
    without anchors or aliases (what ``trusted_config`` then checks).

    Raises:
        Untrusted: the file is too large or holds an anchor or alias.
        UnicodeDecodeError, yaml.YAMLError: not UTF-8 text or not YAML.
    """
    import yaml

    with open(path, "rb") as f:
        data = f.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise Untrusted(f"config.yaml is over {MAX_CONFIG_BYTES:,} bytes")
    return yaml.load(data.decode("utf-8"), Loader=_no_aliases())  # noqa: S506 - a SafeLoader


def allowed_tasks(user_task: str | None) -> tuple[str, ...]:
    """The built-in tasks plus the user's own (``task_target=`` of the report), if given."""
    return BUILTIN_TASKS + ((user_task,) if user_task and user_task not in BUILTIN_TASKS
                            else ())


def _hydra_keys(value: Any, prefix: str = "") -> Iterator[str]:
    if isinstance(value, Mapping):
        for k, v in value.items():
            key = f"{prefix}.{k}" if prefix else str(k)
            if str(k) in HYDRA_KEYS:
                yield key
            yield from _hydra_keys(v, key)
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            yield from _hydra_keys(v, f"{prefix}[{i}]")


# The only interpolations a config.yaml of ours holds: a task's sections, ``task.data: ${data}``
# (``TaskConfig.as_yaml``), compared as strings by ``to_run_config`` and never resolved.
OWN_INTERPOLATIONS = {f"task.{k}": f"${{{k}}}" for k in TASK_SECTIONS}
OWN_HYDRA_KEYS = ("task._target_", "optim._target_", "optim._partial_", "schedule._target_")


def _interpolations(value: Any, prefix: str = "") -> Iterator[str]:
    """Every key whose name or value holds ``${`` (an OmegaConf interpolation or resolver)."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            key = f"{prefix}.{k}" if prefix else str(k)
            if "${" in str(k):
                yield key
            yield from _interpolations(v, key)
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            yield from _interpolations(v, f"{prefix}[{i}]")
    elif isinstance(value, str) and "${" in value and OWN_INTERPOLATIONS.get(prefix) != value:
        yield prefix


def trusted_config(raw: Any, expected: str, allowed: Sequence[str],
                   world_size: int = 1) -> RunConfig:
    """The run's config from its parsed ``config.yaml``, if the report may rebuild it.

    Args:
        raw: ``yaml.safe_load`` of the downloaded ``config.yaml``.
        expected: the run's ``stability.fingerprint`` tag.
        allowed: task import paths that may be instantiated (``allowed_tasks``).
        world_size: the run's data-parallel ranks (part of its fingerprint above 1).

    Raises:
        Untrusted: an interpolation is in the file, the task is not allow-listed, another
            ``_target_`` (or Hydra key) is in the file, a size is over ``MAX_RECORDED_SIZE`` /
            ``MAX_DATA_ELEMENTS``, or the config does not hash to ``expected``. Nothing is
            imported first.
    """
    if not isinstance(raw, Mapping):
        raise Untrusted("config.yaml is not a mapping")
    # First, before any key is read as more than text: OmegaConf would resolve ``${...}``
    # (``oc.create`` builds a ``_target_`` that instantiate then imports and calls).
    planted = next(_interpolations(raw), None)
    if planted is not None:
        raise Untrusted(f"config.yaml holds an interpolation at {planted!r}: a recorded config "
                        "is plain data (allowed: no ${...} but task.data/task.model: "
                        "${data}/${model})")
    task = raw.get("task")
    target = DEFAULT_TASK if task is None else (
        task.get("_target_") if isinstance(task, Mapping) else None)
    if target not in allowed:
        raise Untrusted(f"task._target_={target!r} is not allow-listed: allowed values are "
                        f"{', '.join(allowed)} (your own task: pass task_target=<its import path> "
                        "to the report)")
    allowed_targets = {
        "optim._target_": f"{TRUSTED_OPTIM}<Optimizer class>",
        "schedule._target_": f"null | {' | '.join(TRUSTED_SCHEDULES)} | "
                             f"{TRUSTED_SCHEDULE_PREFIX}<class>",
    }
    for key, allowed_values in allowed_targets.items():
        section = raw.get(key.split(".")[0])
        if isinstance(section, Mapping) and "_target_" in section and not _trusted_target(
                key, section["_target_"]):
            raise Untrusted(f"{key}={section['_target_']!r} is not allow-listed: allowed values "
                            f"are {allowed_values}")
    extra = [k for k in _hydra_keys(raw) if k not in OWN_HYDRA_KEYS]
    if extra:
        raise Untrusted(f"config.yaml holds {extra[0]}: a recorded config may name no object "
                        "to build but its task")
    _check_sizes(raw)
    cfg = to_run_config(raw)
    if fingerprint(cfg, world_size) != expected:
        raise Untrusted("config.yaml does not match the run's fingerprint tag")
    return cfg
