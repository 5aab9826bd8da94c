"""Whether a new model version takes the input the registered model's newest version took.

Reading a version is reading what anyone with write access to the registry wrote: only a
version a report of this project registered, stored on the configured store, is read
(``_model_location``); MLflow would send the user's credentials to any other source.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from stability.tracking import origins
from stability.tracking.contract import Kind, Tag, quote

log = logging.getLogger(__name__)
# The source of a version the report registers: the model it logged (``log_model``'s URI)
LOGGED_MODEL = re.compile(r"models:/(m-[0-9a-f]{32})")


def versions(c: Any, name: str) -> list[Any]:
    """Every version of registered model ``name``."""
    return list(c.search_model_versions(f"name='{quote(name, 'registry.model_name')}'"))


def _inputs(signature: Any) -> str:
    return "none" if signature is None or signature.inputs is None else str(
        signature.inputs.to_json())


def _model_location(c: Any, v: Any) -> str:
    """The checked artifact location of a version a report of ours registered ("" otherwise).

    A version is data anyone with write access to the registry makes: its source may name any
    host, and MLflow sends the user's credentials to it. Only a version whose source is a
    logged model (``models:/<model_id>``) logged into a report run, whose run is a training
    run of that report's experiment, and whose location is on the configured store
    (``origins``) is read.
    """
    source = LOGGED_MODEL.fullmatch(str(v.source or ""))
    if source is None:
        return ""
    logged = c.get_logged_model(source.group(1))
    report, trained = c.get_run(logged.source_run_id), c.get_run(str(v.run_id or ""))
    if (report.data.tags.get(Tag.KIND) != Kind.REPORT.value
            or trained.data.tags.get(Tag.KIND) != Kind.TRAIN.value
            or not (logged.experiment_id == report.info.experiment_id
                    == trained.info.experiment_id)):
        return ""
    root = c.get_experiment(logged.experiment_id).artifact_location
    origins.check(c.tracking_uri, root, f"experiment {logged.experiment_id}")
    return origins.check(c.tracking_uri, str(logged.artifact_location),
                         f"model version {v.name}/{v.version}", root)


def signature_warning(c: Any, name: str, signature: Any) -> str:
    """A warning line when ``signature``'s inputs differ from the newest version's of ``name``.

    One registered model per study (``registry.model_name`` defaults to
    ``<experiment>-winner``) keeps ``@champion`` meaning one kind of model; a name shared by
    two studies gets versions a caller cannot feed the same input. Empty when they match, or
    when there is no earlier version (or its signature cannot be read). Only the newest
    version a report of ours registered is read (``_model_location``): a newer version anyone
    else made is passed over with one line.
    """
    import tempfile

    from mlflow.models import Model

    previous, location = None, ""
    for v in sorted(versions(c, name), key=lambda v: int(v.version), reverse=True):
        try:
            location = _model_location(c, v)
        except origins.ForeignArtifacts as err:
            log.warning("%s", err)
            continue
        except Exception as err:  # its logged model or run is gone: not one of ours to read
            log.debug("version %s of %s is not read: %s", v.version, name, err)
            continue
        if location:
            previous = v
            break
        log.warning("registered model '%s' version %s was not registered by a report of this "
                    "project: its signature is not read", name, v.version)
    if previous is None:
        return ""
    try:
        with tempfile.TemporaryDirectory(prefix="stability-mlmodel-") as tmp:
            old = Model.load(origins.download_at(
                c, location, "MLmodel", tmp, f"model version {name}/{previous.version}")).signature
    except Exception as err:  # an older version without a readable MLmodel: nothing to compare
        log.debug("no signature of %s version %s: %s", name, previous.version, err)
        return ""
    if _inputs(old) == _inputs(signature):
        return ""
    return (f"warning: registered model '{name}': this version's input signature "
            f"{_inputs(signature)} differs from version {previous.version}'s {_inputs(old)}; "
            "callers of @champion get a model that takes other input. Is registry.model_name "
            "shared by two studies? (default: <experiment>-winner)")
