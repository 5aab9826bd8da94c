"""A config-group choice on the command line (``precision=fp8``), checked at the edge.

Hydra rejects an unknown group option with a multi-line "Could not find 'precision/fp8'"
listing and exit status 1; every other bad value of ours is one ``error:`` line and exit 2.
The options are the YAML files of each group folder of ``conf/``. Overrides Hydra's own
grammar has to read (``choice(...)``, globs, interpolations, quoting) and command lines that
add config folders through ``hydra.searchpath`` or ``--config-path`` are left to Hydra; a
``--config-dir DIR`` adds DIR's group folders to the options checked.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

CONF = Path(__file__).resolve().parent / "conf"  # stability/conf is conf/ (a link)
# Groups that live elsewhere too: Hydra's own (launchers and sweepers come from its plugins).
OTHER_SOURCES = ("hydra",)
# Arguments that add config folders: a group may then have options we do not see.
ADDS_CONFIGS = ("hydra.searchpath", "+hydra.searchpath", "--config-path", "-cp")
CONFIG_DIR = ("--config-dir", "-cd")  # its groups are read: ``task=nope`` is still one line
HYDRA_GRAMMAR = set("()[]{}*?$'\" ")


def group_options(conf: Path = CONF, *extra: Path) -> dict[str, list[str]]:
    """Each config group of ``conf`` (and of ``extra`` folders) and its options (the YAML
    files' names, sorted)."""
    options: dict[str, set[str]] = {}
    for folder in (conf, *extra):
        for d in folder.iterdir() if folder.is_dir() else ():
            if d.is_dir() and d.name not in OTHER_SOURCES:
                options.setdefault(d.name, set()).update(p.stem for p in d.glob("*.yaml"))
    return {k: sorted(v) for k, v in options.items()}


def config_dirs(argv: Sequence[str]) -> list[Path]:
    """The folders ``--config-dir DIR`` / ``--config-dir=DIR`` / ``-cd DIR`` add."""
    out = []
    for i, arg in enumerate(argv):
        flag, sep, value = arg.partition("=")
        if flag in CONFIG_DIR:
            value = value if sep else (argv[i + 1] if i + 1 < len(argv) else "")
            if value:
                out.append(Path(value).expanduser().resolve())
    return out


def bad_group_choice(argv: Sequence[str], conf: Path = CONF) -> str | None:
    """The ``error:`` line for the first unknown group option in ``argv``, else None.

    Args:
        argv: the command's overrides (``precision=fp16,bf16 clip.enabled=true ...``).
        conf: the config folder whose groups are checked.

    Returns:
        ``error: precision=fp8 is invalid: allowed values are bf16 | fp16 | fp32``, or None
        when every group choice names an option (or Hydra has to read the line itself).
    """
    if any(a.split("=", 1)[0] in ADDS_CONFIGS for a in argv):
        return None
    dirs = config_dirs(argv)
    options = group_options(conf, *dirs)
    skip = {i + 1 for i, a in enumerate(argv) if a in CONFIG_DIR}  # a flag's value
    for i, arg in enumerate(argv):
        if i in skip or arg.startswith("-"):
            continue
        key, sep, value = arg.partition("=")
        key = key.lstrip("+~")
        if not sep or key not in options or not value or HYDRA_GRAMMAR & set(value):
            continue
        for choice in value.split(","):  # a sweep: one run per choice
            if choice not in options[key]:
                return (f"error: {key}={choice} is invalid: allowed values are "
                        f"{' | '.join(options[key])}")
    return None


def compose_error(config: str, argv: Sequence[str], conf: Path = CONF) -> str | None:
    """The ``error:`` line when Hydra cannot compose ``config`` with ``argv``, else None.

    Hydra reports a bad override (``foo=1``: not in the config; an unparsable value) in a
    dozen lines with exit status 1, which a CI reads as a failed check; composed here first,
    it is one line. Flags: ``--config-dir DIR`` adds DIR to the search path, ``-m`` is ignored;
    anything Hydra's composition does not raise itself is left to the command.
    """
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    overrides, dirs = [], config_dirs(argv)
    skip = {i + 1 for i, a in enumerate(argv) if a in CONFIG_DIR}
    for i, arg in enumerate(argv):
        if i in skip or arg.startswith("-"):
            continue
        overrides.append(arg)
    if dirs:
        overrides.append("hydra.searchpath=[" + ",".join(f"file://{d}" for d in dirs) + "]")
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
            compose(config_name=config, overrides=overrides, return_hydra_config=True)
    except (HydraException, OmegaConfBaseException) as err:
        lines = [" ".join(line.split()) for line in str(err).split("\n\n")[0].splitlines()]
        text = " ".join(x for x in lines if x)
        bad = _unparsable(overrides)
        return "error: " + (f"{bad} does not parse: {text}" if bad else text)[:400]
    finally:
        GlobalHydra.instance().clear()
    return None


def _unparsable(overrides: Sequence[str]) -> str | None:
    # the first override Hydra's grammar rejects (its message does not name it)
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    for o in overrides:
        try:
            parser.parse_overrides([o])
        except Exception:  # noqa: BLE001 - any parse error names this override
            return o
    return None


def _keys(node: object, prefix: str = "") -> list[str]:
    """Every dotted key of a plain config tree (``train.accum_steps``, ``clip``...)."""
    out: list[str] = []
    if isinstance(node, dict):
        for k, v in node.items():
            key = f"{prefix}{k}"
            out += [key, *_keys(v, f"{key}.")]
    return out


def misspelled_key(config: str, argv: Sequence[str], conf: Path = CONF) -> str | None:
    """The ``error:`` line, with "did you mean", for the first override of a key the config
    lacks (``train.acum_steps=2``), else None.

    Hydra says it in seven lines with a ``+`` hint and exit status 1; this composes ``config``
    with the command's group choices only (so a task's own keys count) and looks every other
    plain ``key=value`` up in it. Sweep values (``1,2``), additions (``+key``), deletions
    (``~key``), Hydra's own keys and command lines that add config folders Hydra has to find are
    left to Hydra.
    """
    import difflib

    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    if any(a.split("=", 1)[0] in ADDS_CONFIGS for a in argv):
        return None
    dirs = config_dirs(argv)
    options = group_options(conf, *dirs)
    skip = {i + 1 for i, a in enumerate(argv) if a in CONFIG_DIR}
    plain = [a for i, a in enumerate(argv) if i not in skip and not a.startswith("-")
             and "=" in a and not a.startswith(("+", "~"))]
    # a group chosen or added (``task=adding``, ``+study=gpu_lm``: a preset brings its own keys)
    groups = [a for i, a in enumerate(argv) if i not in skip and "=" in a
              and a.removeprefix("+").split("=", 1)[0] in options]
    choices = [a for a in groups if not HYDRA_GRAMMAR & set(a.split("=", 1)[1]) and "," not in a]
    if len(choices) < len(groups):
        return None  # a swept group (task=a,b): each choice has its own keys, Hydra checks them
    looked_up = [a.split("=", 1)[0] for a in plain if a.split("=", 1)[0] not in options
                 and not a.startswith("hydra") and not set("/@") & set(a.split("=", 1)[0])]
    if not looked_up:
        return None
    extra = ["hydra.searchpath=[" + ",".join(f"file://{d}" for d in dirs) + "]"] if dirs else []
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
            cfg = compose(config_name=config, overrides=[*choices, *extra])
    except (HydraException, OmegaConfBaseException):
        return None  # Hydra says what is wrong with the choices itself
    finally:
        GlobalHydra.instance().clear()
    missing = object()
    tree = OmegaConf.to_container(cfg, resolve=False)
    for key in looked_up:
        try:
            found = OmegaConf.select(cfg, key, default=missing, throw_on_missing=False)
        except OmegaConfBaseException:
            found = missing
        if found is missing:
            close = difflib.get_close_matches(key, _keys(tree), n=3, cutoff=0.75)
            hint = f"; did you mean {' or '.join(close)}?" if close else ""
            return (f"error: {key} is not a key of conf/{config}.yaml{hint} (a key of your "
                    f"own is added with a leading +: +{key}=...)")
    return None
