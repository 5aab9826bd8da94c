"""docker-compose.yml (team MLflow server) checked without a Docker engine, and the SLURM
launcher config (conf/hydra/launcher/slurm.yaml) composed without a cluster.

    .venv/bin/pytest tests/sweep/test_compose.py

The dev and CI machines have the docker CLI but no engine, so the stack is validated by the
Compose-spec JSON schema (check-jsonschema, dev extra), by structure (PyYAML) and by asking the
installed ``mlflow server`` which options it accepts; the same server is tested natively in
tests/tracking/test_artifact_proxy.py.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
ENV_EXAMPLE = ROOT / ".env.example"

# ${VAR}, ${VAR:-default}, ${VAR:?message}; "$${VAR}" is an escaped literal for the container.
VAR_REF = re.compile(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*)(?:[:?+-][^}]*)?\}")
SECRET_KEY = re.compile(r"(PASSWORD|SECRET|_USER$|ACCESS_KEY)")


def check_jsonschema_bin() -> str:
    """check-jsonschema from this interpreter's environment (dev extra), else from PATH."""
    local = Path(sys.executable).parent / "check-jsonschema"
    found = str(local) if local.exists() else shutil.which("check-jsonschema")
    assert found, "check-jsonschema missing: pip install -e '.[dev]'"
    return found


def validate(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [check_jsonschema_bin(), "--builtin-schema", "vendor.compose-spec", str(path)],
        capture_output=True, text=True, timeout=60,
    )


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def services(compose) -> dict:
    return compose["services"]


@pytest.fixture(scope="module")
def env_example() -> dict[str, str]:
    """KEY -> value of .env.example (inline `  # comment` stripped, as Compose does)."""
    out = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, _, value = line.partition("=")
        out[key.strip()] = re.split(r"\s+#", value, maxsplit=1)[0].strip()
    return out


@pytest.fixture(scope="module")
def mlflow_help() -> str:
    """``mlflow server --help`` of the installed MLflow (its click command, run in-process)."""
    import mlflow.cli
    from click.testing import CliRunner

    done = CliRunner().invoke(mlflow.cli.cli, ["server", "--help"])
    assert done.exit_code == 0, done.output
    assert "Usage: " in done.output and "server" in done.output
    return done.output


def one_shot(services: dict) -> set[str]:
    """Services others wait for with ``service_completed_successfully`` (they exit)."""
    return {
        name
        for svc in services.values()
        for name, dep in (svc.get("depends_on") or {}).items()
        if isinstance(dep, dict) and dep.get("condition") == "service_completed_successfully"
    }


SERVER_SCRIPT = ROOT / "docker" / "mlflow-server.sh"


def mlflow_command(services: dict) -> list[str]:
    """The ``exec mlflow server ...`` line of docker/mlflow-server.sh, which compose runs."""
    assert services["mlflow"]["command"] == ["sh", "/mlflow-server.sh"]
    assert "./docker/mlflow-server.sh:/mlflow-server.sh:ro" in services["mlflow"]["volumes"]
    text = SERVER_SCRIPT.read_text().replace("\\\n", " ")
    (line,) = [ln for ln in text.splitlines() if ln.startswith("exec mlflow server")]
    return shlex.split(line)[1:]


def script_reads(name: str) -> bool:
    """docker/mlflow-server.sh uses the environment variable ``name``."""
    return re.search(rf"\$\{{?{name}\b", SERVER_SCRIPT.read_text()) is not None


# --- schema ----------------------------------------------------------------------------


def test_compose_file_passes_the_compose_spec_schema():
    done = validate(COMPOSE)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ok -- validation done" in done.stdout


def test_schema_check_rejects_a_misspelt_key(tmp_path):
    """The validator is not vacuous: the same file with one typo fails."""
    bad = tmp_path / "docker-compose.yml"
    bad.write_text(COMPOSE.read_text().replace("healthcheck:", "healthchek:", 1))
    done = validate(bad)
    assert done.returncode == 1, done.stdout + done.stderr  # check-jsonschema: invalid
    assert "healthchek" in done.stdout


# --- structure ---------------------------------------------------------------------------


def test_every_published_port_is_bound_to_loopback(services):
    published = []
    for name, svc in services.items():
        for port in svc.get("ports", []):
            if isinstance(port, dict):
                assert port.get("host_ip") == "127.0.0.1", f"{name}: {port}"
                published.append(str(port.get("published")))
            else:
                assert str(port).startswith("127.0.0.1:"), f"{name}: {port}"
                published.append(str(port).split(":")[1])
    assert "5000" in published  # the MLflow server itself


def test_every_image_tag_is_pinned(services):
    refs = [svc["image"] for svc in services.values() if "image" in svc]
    for name, svc in services.items():
        assert "image" in svc or "build" in svc, name
        build = svc.get("build")
        if build:
            context = build if isinstance(build, str) else build.get("context", ".")
            dockerfile = "Dockerfile" if isinstance(build, str) else build.get("dockerfile")
            text = (ROOT / context / (dockerfile or "Dockerfile")).read_text()
            refs += re.findall(r"^FROM\s+(\S+)", text, flags=re.MULTILINE)
    assert len(refs) >= 5
    for ref in refs:
        name, _, tag = ref.rpartition("/")[2].partition(":")
        assert tag and tag != "latest" and "$" not in tag, f"unpinned image {ref}"


def test_mlflow_image_matches_the_installed_client_minor(services):
    build = services["mlflow"]["build"]
    text = (ROOT / build["context"] / build["dockerfile"]).read_text()
    (base,) = re.findall(r"^FROM\s+ghcr\.io/mlflow/mlflow:v(\d+)\.(\d+)\.\d+\s*$", text, re.M)
    installed = importlib.metadata.version("mlflow").split(".")[:2]
    assert list(base) == installed
    assert re.search(r"psycopg2-binary==\S+", text) and re.search(r"boto3==\S+", text)
    assert re.search(r"Flask-WTF==\S+", text)  # mlflow[auth]: the basic-auth app needs it


def test_long_running_services_have_healthchecks_and_deps_wait_for_them(services):
    jobs = one_shot(services)
    assert jobs == {"minio-init"}
    for name, svc in services.items():
        if name in jobs:
            assert svc.get("restart") == "no", name
            continue
        test = (svc.get("healthcheck") or {}).get("test")
        assert test and test != ["NONE"], f"{name} has no healthcheck"
        assert svc.get("restart") == "unless-stopped", name
    for name, svc in services.items():
        deps = svc.get("depends_on") or {}
        assert isinstance(deps, dict), f"{name}: depends_on needs conditions"
        for dep, spec in deps.items():
            want = "service_completed_successfully" if dep in jobs else "service_healthy"
            assert spec.get("condition") == want, f"{name} -> {dep}"
    assert set(services["mlflow"]["depends_on"]) == {"postgres", "minio", "minio-init"}


def test_data_lives_in_named_volumes(compose, services):
    declared = set(compose.get("volumes") or {})
    used = set()
    for name, svc in services.items():
        for vol in svc.get("volumes", []):
            source, _, rest = vol.partition(":")
            if source.startswith((".", "/")):  # bind mount: only read-only files from docker/
                assert source.startswith("./docker/") and rest.endswith(":ro"), f"{name}: {vol}"
                assert (ROOT / source).is_file(), vol
            else:
                used.add(source)
    assert used == declared == {"postgres-data", "minio-data"}


def test_credentials_come_from_env_and_all_are_in_env_example(services, env_example):
    text = COMPOSE.read_text()
    referenced = set(VAR_REF.findall(text))
    assert referenced, "no ${VAR} references at all"
    missing = referenced - set(env_example)
    assert not missing, f"referenced in docker-compose.yml but not in .env.example: {missing}"
    unused = set(env_example) - referenced
    assert not unused, f"in .env.example but never used: {unused}"
    for name, svc in services.items():
        env = svc.get("environment") or {}
        assert isinstance(env, dict), name
        for key, value in env.items():
            value = str(value)
            if SECRET_KEY.search(key):
                assert VAR_REF.fullmatch(value), f"{name}.{key} is not a ${{VAR}} reference"
            for userinfo in re.findall(r"://([^/@\s]+)@", value):  # user:password@ in URIs
                assert re.fullmatch(r"(\$\{[^}]+\}:?)+", userinfo), f"{name}.{key}"


def test_env_example_holds_placeholders_only(env_example):
    for key, value in env_example.items():
        assert value, key
        if re.search(r"PASSWORD|SECRET", key):
            assert value.startswith("change-me"), f"{key} should be a change-me placeholder"
            assert len(value) >= 8, f"{key}: MinIO rejects secrets under 8 characters"
    done = subprocess.run(
        ["git", "check-ignore", "-q", ".env"], cwd=ROOT, capture_output=True, timeout=30
    )
    assert done.returncode == 0, ".env must stay git-ignored"


def test_mlflow_serves_artifacts_from_s3_with_one_worker_and_auth(services):
    cmd = mlflow_command(services)
    assert cmd[:2] == ["mlflow", "server"]

    def value(flag: str) -> str:
        assert flag in cmd, f"{flag} missing"
        return cmd[cmd.index(flag) + 1]

    assert "--serve-artifacts" in cmd and "--no-serve-artifacts" not in cmd
    assert value("--workers") == "1" or "--gunicorn-opts" in cmd
    assert value("--artifacts-destination") == "s3://$MLFLOW_BUCKET/"
    assert "--default-artifact-root" not in cmd  # would bypass the proxy
    assert value("--app-name") == "basic-auth"
    assert value("--host") == "${MLFLOW_HOST:-127.0.0.1}"  # natively: loopback
    assert value("--port") == "${MLFLOW_PORT:-5000}"
    assert value("--allowed-hosts") == "$MLFLOW_ALLOWED_HOSTS"
    env = services["mlflow"]["environment"]
    assert env["MLFLOW_BACKEND_STORE_URI"].startswith("postgresql+psycopg2://")
    assert env["MLFLOW_AUTH_DATABASE_URI"].startswith("postgresql+psycopg2://")
    assert env["MLFLOW_AUTH_DATABASE_URI"].endswith("@postgres:5432/${MLFLOW_AUTH_DB}")
    assert env["MLFLOW_S3_ENDPOINT_URL"] == "http://minio:9000"
    assert env["MLFLOW_HOST"] == "0.0.0.0" and "MLFLOW_PORT" not in env  # in the container


def test_the_server_script_gets_every_setting_it_requires(services):
    text = SERVER_SCRIPT.read_text()
    required = set(re.findall(r"\$\{([A-Z0-9_]+):\?\}", text))
    assert {"MLFLOW_BACKEND_STORE_URI", "MLFLOW_AUTH_ADMIN_PASSWORD",
            "MLFLOW_FLASK_SERVER_SECRET_KEY", "AWS_SECRET_ACCESS_KEY"} <= required
    assert required <= set(services["mlflow"]["environment"])
    done = subprocess.run(["sh", "-n", str(SERVER_SCRIPT)], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr
    # default_permission = READ is behaviour: tracking/test_auth.py signs an outsider in and reads


def test_postgres_creates_the_auth_database_on_first_start(services):
    pg = services["postgres"]
    assert "./docker/postgres-init.sh:/docker-entrypoint-initdb.d/10-mlflow-auth.sh:ro" in (
        pg["volumes"])
    assert pg["environment"]["MLFLOW_AUTH_DB"].startswith("${MLFLOW_AUTH_DB")
    script = ROOT / "docker" / "postgres-init.sh"
    done = subprocess.run(["sh", "-n", str(script)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr


@pytest.mark.server
@pytest.mark.slow
def test_postgres_init_script_runs_again_on_an_initialised_cluster(team_stack):
    """Idempotent: a second run (the team stack's PostgreSQL already ran it) succeeds and
    leaves one auth database."""
    env, pg = team_stack.dotenv, team_stack.postgres
    again = pg.init_auth_db(env["POSTGRES_DB"], env["MLFLOW_AUTH_DB"])
    assert f"database {env['MLFLOW_AUTH_DB']} ready" in again.stdout
    names = [name for (name,) in pg.query("postgres", "SELECT datname FROM pg_database")]
    assert names.count(env["MLFLOW_AUTH_DB"]) == 1


def test_default_allowed_hosts_let_a_local_client_in(env_example):
    from mlflow.server.security_utils import is_allowed_host_header

    allowed = env_example["MLFLOW_ALLOWED_HOSTS"].split(",")
    for host in ("localhost:5000", "127.0.0.1:5000", "localhost", "127.0.0.1"):
        assert is_allowed_host_header(allowed, host), host
    assert not is_allowed_host_header(allowed, "evil.example.com")


def test_mlflow_options_are_accepted_by_the_installed_server(services, mlflow_help):
    accepted = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", mlflow_help))
    assert {"--serve-artifacts", "--workers", "--artifacts-destination"} <= accepted
    used = {arg for arg in mlflow_command(services) if arg.startswith("--")}
    assert used, "no options parsed from the compose command"
    assert used <= accepted, f"not accepted by `mlflow server`: {used - accepted}"


def test_mlflow_environment_names_are_real_mlflow_settings(services):
    import mlflow.cli
    import mlflow.environment_variables as known

    server_env = {p.envvar for p in mlflow.cli.server.params if isinstance(p.envvar, str)}
    for key in services["mlflow"]["environment"]:
        if key.startswith("MLFLOW_"):  # MLflow's own, or one docker/mlflow-server.sh reads
            assert key in server_env or hasattr(known, key) or script_reads(key), (
                f"unknown MLflow setting {key}")
    assert "MLFLOW_BACKEND_STORE_URI" in server_env


MINIO_ENV = {"MINIO_ROOT_USER": "root", "MINIO_ROOT_PASSWORD": "rootpw",
             "MLFLOW_BUCKET": "mlflow", "MLFLOW_S3_ACCESS_KEY": "mlflow-key",
             "MLFLOW_S3_SECRET_KEY": "mlflow-secret"}


def _minio_init(tmp_path: Path, env: dict[str, str], fail: str = "") -> tuple[
        subprocess.CompletedProcess[str], list[list[str]]]:
    """Run docker/minio-init.sh with a stand-in ``mc`` that records each call (and copies the
    policy file it is given); ``fail``: the subcommand the stand-in fails.

    A seam, on purpose: the MinIO client is a downloaded binary that no registry here serves,
    and what is under test is the script's sequence of calls and its stop at the first failure.
    The real S3 path (moto's server, MLflow uploading into it) runs in tests/test_team_stack.py.
    """
    bin_dir, log = tmp_path / "bin", tmp_path / "mc.log"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "mc"
    fake.write_text(f"""#!/bin/sh
printf '%s\\037' "$@" >> {log}; echo >> {log}
case "$*" in *"policy create"*) cp "$6" {tmp_path / "policy.json"};; esac
[ -n "{fail}" ] && case "$*" in "{fail}"*) exit 1;; esac
exit 0
""")
    fake.chmod(0o755)
    done = subprocess.run(["sh", str(ROOT / "docker" / "minio-init.sh")], capture_output=True,
                          text=True, timeout=30, env={"PATH": f"{bin_dir}:/usr/bin:/bin", **env})
    calls = [line.split("\037")[:-1] for line in log.read_text().splitlines()] \
        if log.exists() else []
    return done, calls


def test_minio_init_creates_the_bucket_a_policy_limited_to_it_and_the_servers_key(tmp_path):
    done, calls = _minio_init(tmp_path, MINIO_ENV)
    assert done.returncode == 0, done.stderr
    assert [c[:3] for c in calls] == [
        ["alias", "set", "local"], ["mb", "--ignore-existing", "local/mlflow"],  # idempotent
        ["admin", "policy", "create"], ["admin", "user", "add"],
        ["admin", "policy", "attach"]]
    assert calls[3][3:] == ["local", "mlflow-key", "mlflow-secret"]
    assert calls[4][3:] == ["local", "mlflow-artifacts", "--user", "mlflow-key"]
    policy = json.loads((tmp_path / "policy.json").read_text())
    resources = {r for s in policy["Statement"] for r in s["Resource"]}
    assert resources == {"arn:aws:s3:::mlflow", "arn:aws:s3:::mlflow/*"}  # that bucket only


def test_minio_init_stops_at_the_first_failure_and_on_a_missing_setting(tmp_path):
    done, calls = _minio_init(tmp_path, MINIO_ENV, fail="mb")
    assert done.returncode == 1, done.stderr  # the failed mc call's status (set -e)
    assert [c[0] for c in calls] == ["alias", "mb"]  # no key made for a bucket that is not
    missing = {k: v for k, v in MINIO_ENV.items() if k != "MLFLOW_S3_SECRET_KEY"}
    (tmp_path / "again").mkdir()
    done, calls = _minio_init(tmp_path / "again", missing)
    assert done.returncode == 2 and calls == [], done.stderr  # sh: ${VAR:?} unset
    assert "MLFLOW_S3_SECRET_KEY" in done.stderr


# --- cluster launcher ----------------------------------------------------------------------


def test_slurm_launcher_composes_without_a_cluster(monkeypatch):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf
    from omegaconf.errors import InterpolationResolutionError

    overrides = ["hydra/launcher=slurm", "hydra.launcher.partition=gpu-short"]
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=overrides, return_hydra_config=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_ == "hydra_plugins.stability_slurm.stability_slurm.SlurmLauncher"
    assert launcher.partition == "gpu-short"
    assert launcher.cpus_per_task == cfg.train.threads
    assert launcher.array_parallelism >= 1 and launcher.timeout_min >= 1

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow-host:5000")
    setup = OmegaConf.to_container(launcher.setup, resolve=True)
    assert "export MLFLOW_TRACKING_URI=http://mlflow-host:5000" in setup
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    with pytest.raises(InterpolationResolutionError, match="MLFLOW_TRACKING_URI"):
        OmegaConf.to_container(launcher.setup, resolve=True)


def test_slurm_setup_quotes_a_hostile_tracking_uri(monkeypatch, tmp_path):
    """A ' or $( in MLFLOW_TRACKING_URI stays part of the value in the sbatch script."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    marker = tmp_path / "pwned"
    hostile = f"http://h:5000/'; touch {marker}; echo '$(touch {marker})`touch {marker}`"
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["hydra/launcher=slurm"], return_hydra_config=True)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", hostile)
    export = OmegaConf.to_container(cfg.hydra.launcher.setup, resolve=True)[0]
    done = subprocess.run(["sh", "-c", f'{export}\nprintf %s "$MLFLOW_TRACKING_URI"'],
                          capture_output=True, text=True, timeout=30, env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert done.stdout == hostile
    assert not marker.exists()


def test_the_server_script_refuses_placeholders_binds_loopback_and_sends_no_telemetry(tmp_path):
    """docker/mlflow-server.sh run natively with .env.example's values: one line, exit 2."""
    text = SERVER_SCRIPT.read_text()
    assert "export MLFLOW_DISABLE_TELEMETRY=true" in text
    assert '--host "${MLFLOW_HOST:-127.0.0.1}"' in text
    required = set(re.findall(r"\$\{([A-Z0-9_]+):\?\}", text))
    good = {k: "a-real-secret-0123456789" for k in required}
    for key in ("MLFLOW_AUTH_ADMIN_PASSWORD", "MLFLOW_FLASK_SERVER_SECRET_KEY",
                "AWS_SECRET_ACCESS_KEY", "MLFLOW_BACKEND_STORE_URI"):
        value = ("postgresql+psycopg2://u:change-me-postgres@db/x" if key.endswith("URI")
                 else "change-me-mlflow-admin")
        env = {"PATH": "/usr/bin:/bin", "TMPDIR": str(tmp_path)} | good | {key: value}
        done = subprocess.run(["sh", str(SERVER_SCRIPT)], capture_output=True, text=True,
                              timeout=30, env=env)
        assert done.returncode == 2, (key, done.stderr)
        assert done.stderr.strip().splitlines() == [
            f"error: {key} holds the .env.example placeholder (change-me...): allowed values "
            "are your own secret (docs/team-server.md)"]
