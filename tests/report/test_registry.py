"""Two studies in one store: one registered model each, and a warning when a name is shared.

A real embedded SQLite store holds two fixture sweeps of different input shapes (sequence
length 30 and 20: different model input signatures) in two experiments; each is reported as a
user would, with the default ``registry.model_name``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from stability.report import ReportConfig, build_report
from stability.report.options import ReportError, to_report_config
from tests.helpers.report_fixtures import Spec, make_sweep
from tests.helpers.stores import sqlite_store

LONG = [Spec(precision="fp32", clip=None, accum=1, losses={0: 0.50, 1: 0.52}),
        Spec(precision="bf16", clip=1.0, accum=1, losses={0: 0.40, 1: 0.41})]
SHORT = [Spec(precision="fp32", clip=None, accum=1, losses={0: 0.30, 1: 0.31}, seq_len=20),
         Spec(precision="fp16", clip=1.0, accum=2, losses={0: 0.45, 1: 0.44}, seq_len=20)]


@pytest.fixture(scope="module")
def two_studies(tmp_path_factory):
    root = tmp_path_factory.mktemp("two-studies")
    uri = sqlite_store(root / "mlflow.db")
    make_sweep(uri, "sign-long", "long-1", LONG, root)
    make_sweep(uri, "sign-short", "short-1", SHORT, root)
    reports = {exp: build_report(ReportConfig(tracking_uri=uri, experiment=exp, device="cpu",
                                              output_dir=str(root / "reports"), plots=False))
               for exp in ("sign-long", "sign-short")}
    return uri, root, reports


@pytest.mark.slow
def test_each_study_gets_its_own_registered_model_and_the_answer_names_it(two_studies):
    uri, _, reports = two_studies
    c = MlflowClient(uri)
    names = sorted(m.name for m in c.search_registered_models())
    assert names == ["sign-long-winner", "sign-short-winner"]
    for exp, winner_config in (("sign-long", "bf16 clip=1 acc=1"),
                               ("sign-short", "fp32 noclip acc=1")):
        model = c.get_registered_model(f"{exp}-winner")
        champion = c.get_model_version_by_alias(model.name, "champion")
        assert str(champion.version) == "1" and champion.tags["config"] == winner_config
        report = (reports[exp].folder / "report.md").read_text()
        answer = report.split("## Answer", 1)[1].split("## Selection rule", 1)[0]
        assert f'mlflow.pyfunc.load_model("models:/{exp}-winner@champion")' in answer
        assert "input signature" not in report  # no name shared: no warning


@pytest.mark.slow
def test_a_name_shared_by_two_studies_warns_that_the_signature_changed(two_studies, caplog):
    uri, root, _ = two_studies
    shared = ReportConfig(tracking_uri=uri, experiment="sign-short", device="cpu", plots=False,
                          output_dir=str(root / "shared"), model_name="sign-long-winner")
    with caplog.at_level("WARNING", logger="stability.report.publish.publish"):
        outcome = build_report(shared)
    assert outcome.model_version == "2"  # the override still wins over <experiment>-winner
    warnings = [r.getMessage() for r in caplog.records if "input signature" in r.getMessage()]
    assert len(warnings) == 1 and "\n" not in warnings[0]
    assert warnings[0].startswith("warning: registered model 'sign-long-winner': this "
                                  "version's input signature")
    assert "differs from version 1's" in warnings[0]
    assert '30, 1' in warnings[0] and '20, 1' in warnings[0]  # the two input shapes
    report = (outcome.folder / "report.md").read_text()
    assert "differs from version 1's" in report  # under "Problems while writing this report"
    c = MlflowClient(uri)
    assert str(c.get_model_version_by_alias("sign-long-winner", "champion").version) == "2"


def test_the_default_name_follows_the_experiment_and_a_bad_name_is_refused() -> None:
    assert ReportConfig().registered_model == "stability-winner"
    assert ReportConfig(experiment="adding").registered_model == "adding-winner"
    assert ReportConfig(experiment="team/char:lm").registered_model == \
        "team-char-lm-43c7134ec6-winner"
    # Issue 31 P: three experiments, three models; a plain name posing as a hashed one too
    names = {ReportConfig(experiment=e).registered_model
             for e in ("team study", "team/study", "team-study")}
    assert len(names) == 3 and "team-study-winner" in names
    posing = ReportConfig(experiment="team study").registered_model.removesuffix("-winner")
    assert ReportConfig(experiment=posing).registered_model != f"{posing}-winner"
    assert ReportConfig(experiment="x", model_name="mine").registered_model == "mine"
    cfg = to_report_config({"experiment": "adding", "registry": {"model_name": None}})
    assert cfg.registered_model == "adding-winner"
    assert ReportConfig(experiment="it's mine").registered_model.startswith("it-s-mine-")
    with pytest.raises(ReportError, match=r"registry\.model_name='a/b' is invalid: allowed "
                                          r"values are null \(<experiment>-winner\) or a model "
                                          r"name of letters, digits"):
        ReportConfig(model_name="a/b")


def test_the_shipped_report_config_leaves_the_name_to_the_experiment() -> None:
    import yaml

    conf = yaml.safe_load((Path(__file__).resolve().parents[2] / "conf" / "report.yaml")
                          .read_text())
    assert conf["registry"]["model_name"] is None


@pytest.mark.slow
def test_a_planted_version_tagged_with_the_sweep_and_winner_is_never_reused(tmp_path):
    """Issue 31 E: a version an attacker registered in ``<experiment>-winner``, tagged with the
    victim's sweep id and winner and naming its training run, made the report print
    "(existing)" and move @champion to it. Now only the report's own version is reused."""
    from stability.core.identity import fingerprint
    from tests.helpers.report_fixtures import run_config

    uri = sqlite_store(tmp_path / "mlflow.db")
    ids = make_sweep(uri, "victim", "v1", LONG, tmp_path)
    c = MlflowClient(uri)
    fp = fingerprint(run_config(LONG[1], 0, Path(".")))
    evil = tmp_path / "evil"
    evil.mkdir()
    c.create_registered_model("victim-winner")
    planted = c.create_model_version("victim-winner", source=evil.as_uri(),
                                     run_id=ids[(fp, 0)], tags={"sweep_id": "v1", "winner": fp})
    cfg = ReportConfig(tracking_uri=uri, experiment="victim", device="cpu", plots=False,
                       output_dir=str(tmp_path / "reports"))
    first = build_report(cfg)
    assert first.winner == fp and first.model_created and first.model_version == "2"
    champion = c.get_model_version_by_alias("victim-winner", "champion")
    assert str(champion.version) == "2" and champion.source != planted.source
    again = build_report(cfg)  # the report's own version is still reused
    assert (again.model_version, again.model_created) == ("2", False)


def _evil_model(marker: Path):  # a PythonModel whose loading writes ``marker``
    import mlflow.pyfunc

    class Evil(mlflow.pyfunc.PythonModel):
        def load_context(self, context):  # noqa: ARG002 - runs in whoever loads the model
            marker.write_text("her code ran")

        def predict(self, context, model_input):  # noqa: ARG002
            return model_input

    return Evil()


@pytest.mark.slow
def test_a_planted_pyfunc_dressed_as_the_sweeps_own_version_is_never_reused(tmp_path):
    """Issue 55, item 6: mallory logs a pyfunc into a run she tags ``kind=report`` with the
    victim's sweep id and winner, and registers it naming the winner's training run. The report
    printed ``model version: 2 (existing)``, moved ``@champion`` to it, and loading
    ``models:/victim-winner@champion`` as the README says ran her code. Now only a version the
    report folder's own ledger names is reused: a new version is registered, ``@champion`` is
    it, and loading it runs nothing of hers; a second report reuses its own."""
    import mlflow
    import mlflow.pyfunc

    from stability.core.identity import fingerprint
    from stability.tracking.contract import Tag
    from tests.helpers.report_fixtures import run_config

    uri = sqlite_store(tmp_path / "mlflow.db")
    ids = make_sweep(uri, "victim", "v1", LONG, tmp_path)
    c = MlflowClient(uri)
    exp_id = c.get_experiment_by_name("victim").experiment_id
    fp = fingerprint(run_config(LONG[1], 0, Path(".")))
    cfg = ReportConfig(tracking_uri=uri, experiment="victim", device="cpu", plots=False,
                       output_dir=str(tmp_path / "reports"))
    marker = tmp_path / "marker"
    hers = c.create_run(exp_id, tags={Tag.KIND: "report", Tag.SWEEP_ID: "v1", Tag.WINNER: fp,
                                      "mlflow.user": "mallory"}).info.run_id
    mlflow.set_tracking_uri(uri)
    with mlflow.start_run(run_id=hers):
        info = mlflow.pyfunc.log_model(name="model", python_model=_evil_model(marker))
    c.set_terminated(hers)
    marker.unlink(missing_ok=True)  # MLflow loads a pyfunc once while logging it
    c.create_registered_model("victim-winner")
    planted = c.create_model_version("victim-winner", source=info.model_uri,
                                     run_id=ids[(fp, 0)], model_id=info.model_id,
                                     tags={"sweep_id": "v1", "winner": fp})
    assert str(planted.version) == "1"
    first = build_report(cfg)
    assert (first.model_version, first.model_created) == ("2", True), first
    champion = c.get_model_version_by_alias("victim-winner", "champion")
    assert str(champion.version) == "2" and champion.source != planted.source
    mlflow.pyfunc.load_model("models:/victim-winner@champion")
    assert not marker.exists()
    again = build_report(cfg)  # its own version, named in its folder's ledger, is reused
    assert (again.model_version, again.model_created) == ("2", False)
    mlflow.pyfunc.load_model(planted.source)  # the control: loading hers does run her code
    assert marker.read_text() == "her code ran"
