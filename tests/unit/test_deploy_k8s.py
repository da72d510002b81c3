"""docker/k8s: the Go validator (docker/k8s/validate, strict decoding into the k8s.io/api
types) accepts the manifests and rejects broken ones, and the relay container's environment
and mounted TOML are real settings that fit the Deployment (grace period, ports).

The Go modules come from the Go module proxy on first use and are cached under
``$CDC_OUTBOX_CACHE_DIR/go`` (default ``~/.cache/cdc-outbox/go``); ``go`` must be installed
(scripts/bootstrap.sh does that), this test never skips."""

from __future__ import annotations

import os
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdc_outbox.errors import ConfigError
from tests.support.deploy import DOCKER, DUMMY_DSN, ROOT, image_env, settings_of

K8S = DOCKER / "k8s"
VALIDATOR = K8S / "validate"


def go_env(**extra: str) -> dict[str, str]:
    """The environment bootstrap.sh also uses: module and build caches of our own."""
    cache = Path(os.environ.get("CDC_OUTBOX_CACHE_DIR") or Path.home() / ".cache/cdc-outbox")
    env = {k: v for k, v in os.environ.items() if k != "K8S_MANIFEST_DIR"}
    env.update(
        GOFLAGS="-mod=mod",
        GOMODCACHE=str(cache / "go" / "mod"),
        GOCACHE=str(cache / "go" / "build"),
        GOTOOLCHAIN="local",
    )
    env.update(extra)
    return env


def go_test(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    go = shutil.which("go")
    assert go is not None, "go is not installed: run scripts/bootstrap.sh"
    return subprocess.run(
        [go, "test", "-count=1", "-v", *args, "./..."],
        cwd=VALIDATOR, env=go_env(**env), capture_output=True, text=True, timeout=900,
        check=False,
    )  # fmt: skip


def manifests() -> dict[str, dict[str, Any]]:
    """``kind -> object`` of every manifest (one object per kind here)."""
    out: dict[str, dict[str, Any]] = {}
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                assert doc["kind"] not in out, doc["kind"]
                out[doc["kind"]] = doc
    return out


def test_go_validator_accepts_the_manifests_and_rejects_broken_ones() -> None:
    result = go_test()
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    for test in (
        "TestManifestsDecodeStrictly",
        "TestBrokenManifestsAreRejected/unknown-field",
        "TestBrokenManifestsAreRejected/wrong-type",
        "TestBrokenCopiesAreRejected/bad_quantity",
        "TestBrokenCopiesAreRejected/missing_secret_key",
    ):
        assert f"--- PASS: {test} " in output, test


def test_a_broken_manifest_fails_the_go_test(tmp_path: Path) -> None:
    for path in K8S.glob("*.yaml"):
        text = path.read_text()
        if path.name == "deployment.yaml":
            text = text.replace(
                "terminationGracePeriodSeconds: 45", 'terminationGracePeriodSeconds: "45"'
            )
        (tmp_path / path.name).write_text(text)
    result = go_test("-run", "TestManifestsDecodeStrictly", K8S_MANIFEST_DIR=str(tmp_path))
    assert result.returncode != 0
    assert "PodSpec.spec.template.spec.terminationGracePeriodSeconds of type int64" in result.stdout


def container_env(objects: dict[str, dict[str, Any]], config_file: Path) -> dict[str, str]:
    """The relay container's CDC_OUTBOX_* variables as the pod sees them: secret references
    resolved from the example Secret (a dummy DSN if it lacks the key), CDC_OUTBOX_CONFIG
    checked against the ConfigMap mount and pointed at ``config_file``, a copy of its TOML."""
    pod = objects["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    secret = objects["Secret"]
    env: dict[str, str] = {}
    for var in container["env"]:
        name = var["name"]
        if "valueFrom" in var:
            ref = var["valueFrom"]["secretKeyRef"]
            assert ref["name"] == secret["metadata"]["name"]
            env[name] = secret.get("stringData", {}).get(ref["key"], DUMMY_DSN)
        else:
            env[name] = str(var["value"])
    mounted = Path(env["CDC_OUTBOX_CONFIG"])
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == str(mounted.parent)]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    configmap = objects["ConfigMap"]
    assert volume["configMap"]["name"] == configmap["metadata"]["name"]
    config_file.write_text(configmap["data"][mounted.name])
    env["CDC_OUTBOX_CONFIG"] = str(config_file)
    return env


def test_container_settings_are_real_and_fit_the_deployment(tmp_path: Path) -> None:
    objects = manifests()
    env = container_env(objects, tmp_path / "cdc-outbox.toml")
    assert all(name.startswith("CDC_OUTBOX_") for name in env)
    settings = settings_of({**image_env(), **env})  # ConfigError for an unknown key/variable
    assert settings.postgres_dsn() == objects["Secret"]["stringData"]["dsn"]
    assert settings.metrics_host == "0.0.0.0"
    deployment = objects["Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] > settings.shutdown_grace_s + 5
    (container,) = pod["containers"]
    (port,) = container["ports"]
    assert port["containerPort"] == settings.metrics_port
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(settings.metrics_port)
    assert container["livenessProbe"]["httpGet"]["port"] == port["name"]
    assert container["readinessProbe"]["httpGet"]["port"] == port["name"]
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert container["image"] == f"cdc-outbox:{version}"
    assert container["args"] == ["run"]
    assert objects["Service"]["spec"]["ports"][0]["targetPort"] == port["name"]
    assert deployment["spec"]["replicas"] == 2 and objects["PodDisruptionBudget"]


def test_an_unknown_key_in_the_configmap_is_caught(tmp_path: Path) -> None:
    objects = manifests()
    data = objects["ConfigMap"]["data"]
    (key,) = data
    data[key] = data[key].replace("shutdown_grace_s", "shutdown_grace")
    env = container_env(objects, tmp_path / "cdc-outbox.toml")
    with pytest.raises(ConfigError, match="unknown key 'shutdown_grace'"):
        settings_of({**image_env(), **env})
