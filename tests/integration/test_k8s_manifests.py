"""deploy/k8s, offline: every overlay renders (``kubectl kustomize``), every rendered object
validates strictly against the Kubernetes API schemas of a current release
(``kubernetes-validate``, bundled schemas, no cluster), and the objects say what
docs/kubernetes.md promises: bookies a StatefulSet with journal and ledger claims and a stable
advertised address, brokers a Deployment with an HPA and a grace period longer than their
shutdown timeout, probes on endpoints that exist, every ``MAGNETAR_*`` variable a setting of the
service it is given to, every Magnetar container on the Dockerfile's image. And the Dockerfile
itself: slim base, non-root user, ``magnetar`` as entrypoint, no HEALTHCHECK, no compilers in the
final stage (no container runtime runs here to build it)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from kubernetes_validate.utils import latest_version

from magnetar.bkshell import ShellTls
from magnetar.bookie.config import BookieConfig
from magnetar.broker.admin.app import build_app
from magnetar.broker.config import BrokerConfig
from magnetar.cli import _COMMANDS
from magnetar.proxy.config import ProxyConfig
from tests.support.k8s import OVERLAYS, ROOT, WORKLOADS, Manifests, manifests, render

#: The settings each Magnetar command reads from MAGNETAR_* variables.
SETTINGS = {
    "bookie": {f.name for f in dataclasses.fields(BookieConfig)},
    "broker": {f.name for f in dataclasses.fields(BrokerConfig)},
    "proxy": {f.name for f in dataclasses.fields(ProxyConfig)},
    # The init Job reads the broker's metadata URL, cluster name and etcd TLS settings.
    "initialize-cluster-metadata": {f.name for f in dataclasses.fields(BrokerConfig)}
    | {f.name for f in dataclasses.fields(ShellTls)},
}


#: The settings reference (scripts/config_reference.py), where every setting is documented.
REFERENCE = (ROOT / "docs" / "configuration.md").read_text()


def magnetar_containers(m: Manifests) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(workload, container) for every container running Magnetar's image."""
    found = []
    for kind in WORKLOADS:
        for workload in m.of_kind(kind):
            for container in workload["spec"]["template"]["spec"]["containers"]:
                if container["name"] != "etcd":
                    found.append((workload, container))
    return found


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_validates_strictly(overlay: str) -> None:
    version = latest_version()
    objects = render(overlay)
    assert len(objects) > 15
    for obj in objects:
        # strict: a field the schema does not know is an error, not ignored.
        kubernetes_validate.validate(obj, version, strict=True)


def test_strict_validation_refuses_a_misspelt_field() -> None:
    broker = dict(manifests("dev").get("Deployment", "broker"))
    broker["spec"] = {**broker["spec"], "replica": 3}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broker, latest_version(), strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_bookies_are_a_statefulset_with_stable_addresses_and_two_volumes(overlay: str) -> None:
    m = manifests(overlay)
    bookie = m.get("StatefulSet", "bookie")
    spec = bookie["spec"]
    claims = [c["metadata"]["name"] for c in spec["volumeClaimTemplates"]]
    assert claims == ["journal", "ledgers"]
    assert spec["persistentVolumeClaimRetentionPolicy"] == {
        "whenDeleted": "Retain",
        "whenScaled": "Retain",
    }
    service = m.get("Service", spec["serviceName"])
    assert service["spec"]["clusterIP"] == "None"
    container = m.container(bookie)
    env = m.environment(container)
    # The advertised address is the pod's stable DNS name under the headless Service.
    assert env["MAGNETAR_ADVERTISED_ADDRESS"] == (
        f"$(POD_NAME).{spec['serviceName']}.$(POD_NAMESPACE).svc"
    )
    mounts = {v["name"]: v["mountPath"] for v in container["volumeMounts"]}
    assert env["MAGNETAR_JOURNAL_DIR"].startswith(mounts["journal"] + "/")
    assert env["MAGNETAR_LEDGER_DIR"].startswith(mounts["ledgers"] + "/")
    # Autorecovery in the bookies; the decommission hook bounded by the grace period.
    assert env["MAGNETAR_AUTO_RECOVERY_DAEMON_ENABLED"] == "true"
    hook = container["lifecycle"]["preStop"]["exec"]["command"]
    assert hook[:3] == ["magnetar", "bk", "prestop"]
    grace = spec["template"]["spec"]["terminationGracePeriodSeconds"]
    assert float(hook[hook.index("--timeout") + 1]) < grace
    pdb = m.get("PodDisruptionBudget", "bookie")
    assert pdb["spec"]["maxUnavailable"] == 1
    anti = spec["template"]["spec"]["affinity"]["podAntiAffinity"]
    hard = "requiredDuringSchedulingIgnoredDuringExecution" in anti
    assert hard == (overlay == "production")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_brokers_are_a_deployment_with_hpa_grace_and_pod_ip(overlay: str) -> None:
    m = manifests(overlay)
    broker = m.get("Deployment", "broker")
    hpa = m.get("HorizontalPodAutoscaler", "broker")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "broker",
    }
    assert [metric["resource"]["name"] for metric in hpa["spec"]["metrics"]] == ["cpu"]
    assert hpa["spec"]["minReplicas"] <= broker["spec"]["replicas"] <= hpa["spec"]["maxReplicas"]
    assert m.get("PodDisruptionBudget", "broker")
    env = m.environment(m.container(broker))
    assert env["MAGNETAR_ADVERTISED_ADDRESS"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    grace = broker["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert int(env["MAGNETAR_BROKER_SHUTDOWN_TIMEOUT_MS"]) < grace * 1000
    assert broker["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_magnetar_setting_exists_and_every_image_is_the_dockerfiles(overlay: str) -> None:
    m = manifests(overlay)
    for workload, container in magnetar_containers(m):
        assert "command" not in container, "the image's entrypoint (magnetar) runs"
        command = container["args"][0]
        assert command in _COMMANDS, (workload["metadata"]["name"], command)
        assert container["image"] == "magnetar:0.1.0", container["image"]
        for name in m.environment(container):
            if name.startswith("MAGNETAR_"):
                setting = name.removeprefix("MAGNETAR_").lower()
                assert setting in SETTINGS[command], f"{command}: {name} is no setting"
                assert f"`{name}`" in REFERENCE, f"{name} is not in docs/configuration.md"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_probes_point_at_endpoints_that_exist(overlay: str) -> None:
    broker_paths = {
        r.canonical
        for r in build_app(_ProbeBroker()).router.resources()  # type: ignore[arg-type]
    }
    served = {
        "broker": broker_paths,
        "bookie": _registered_paths(ROOT / "services/bookie/service.py"),
        "proxy": _registered_paths(ROOT / "services/proxy/http.py"),
    }
    m = manifests(overlay)
    probed = 0
    for _workload, container in magnetar_containers(m):
        ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
        env = m.environment(container)
        for kind in ("readinessProbe", "livenessProbe", "startupProbe"):
            probe = container.get(kind)
            if probe is None:
                continue
            get = probe["httpGet"]
            command = container["args"][0]
            assert get["path"] in served[command], (command, kind, get["path"])
            assert int(env["MAGNETAR_HTTP_PORT"]) == ports[get["port"]]
            probed += 1
    assert probed >= 6
    broker = m.container(m.get("Deployment", "broker"))
    assert broker["readinessProbe"]["httpGet"]["path"] == "/admin/v2/brokers/ready"
    bookie = m.container(m.get("StatefulSet", "bookie"))
    assert bookie["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert bookie["livenessProbe"]["httpGet"]["path"] == "/health"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pods_run_locked_down_with_resources_and_scrape_annotations(overlay: str) -> None:
    m = manifests(overlay)
    assert not m.of_kind("Role") and not m.of_kind("ClusterRole")
    assert not m.of_kind("RoleBinding") and not m.of_kind("ClusterRoleBinding")
    assert m.get("ServiceAccount", "magnetar")["automountServiceAccountToken"] is False
    for kind in WORKLOADS:
        for workload in m.of_kind(kind):
            pod = workload["spec"]["template"]
            assert pod["spec"]["serviceAccountName"] == "magnetar"
            assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
            if kind != "Job":
                annotations = pod["metadata"]["annotations"]
                assert annotations["prometheus.io/scrape"] == "true"
            for container in pod["spec"]["containers"]:
                security = container["securityContext"]
                assert security["allowPrivilegeEscalation"] is False
                assert security["readOnlyRootFilesystem"] is True
                assert security["capabilities"]["drop"] == ["ALL"]
                assert set(container["resources"]) == {"requests", "limits"}


def test_dev_and_production_sizes_and_security() -> None:
    dev, prod = manifests("dev"), manifests("production")
    sizes = {
        name: (dev.get(kind, name)["spec"]["replicas"], prod.get(kind, name)["spec"]["replicas"])
        for kind, name in (
            ("StatefulSet", "etcd"),
            ("StatefulSet", "bookie"),
            ("Deployment", "broker"),
            ("Deployment", "proxy"),
        )
    }
    assert sizes == {"etcd": (1, 3), "bookie": (3, 4), "broker": (2, 3), "proxy": (1, 2)}
    assert dev.get("Service", "proxy")["spec"]["type"] == "ClusterIP"
    assert prod.get("Service", "proxy")["spec"]["type"] == "LoadBalancer"
    for name in ("broker", "proxy"):
        dev_env = dev.environment(dev.container(dev.get("Deployment", name)))
        prod_env = prod.environment(prod.container(prod.get("Deployment", name)))
        assert dev_env.get("MAGNETAR_AUTHENTICATION_ENABLED", "false") == "false"
        assert prod_env["MAGNETAR_AUTHENTICATION_ENABLED"] == "true"
        assert prod_env["MAGNETAR_AUTHORIZATION_ENABLED"] == "true"
    # Keys and certificates come from Secrets, mounted read-only, never from the manifests.
    assert not prod.of_kind("Secret")
    for kind, name in (
        ("StatefulSet", "bookie"),
        ("Deployment", "broker"),
        ("StatefulSet", "etcd"),
    ):
        pod = prod.get(kind, name)["spec"]["template"]["spec"]
        secrets = {v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
        assert "magnetar-tls" in secrets
    bookie_env = prod.environment(prod.container(prod.get("StatefulSet", "bookie")))
    assert bookie_env["MAGNETAR_TLS_CERTIFICATE_PATH"].startswith("/etc/magnetar/tls/")
    assert len(prod.environment(prod.container(prod.get("StatefulSet", "etcd")))) > 10
    assert prod.get("Namespace", "magnetar")


def test_dockerfile_base_user_entrypoint() -> None:
    text = (ROOT / "Dockerfile").read_text()
    lines = [line.strip() for line in text.splitlines() if line.strip() and line[0] != "#"]
    stages = [i for i, line in enumerate(lines) if line.startswith("FROM ")]
    assert len(stages) == 2, "a build stage and a run stage"
    final = lines[stages[-1] :]
    assert re.fullmatch(r"FROM python:3\.11-slim(-\w+)?", final[0]), final[0]
    users = [line for line in final if line.startswith("USER ")]
    assert users and users[-1].split()[1].split(":")[0] not in ("0", "root")
    assert users[-1].split()[1].split(":")[0].isdigit(), "numeric: runAsNonRoot can check it"
    assert 'ENTRYPOINT ["magnetar"]' in final
    assert not any(line.startswith("HEALTHCHECK") for line in lines)
    run = " ".join(line for line in final if not line.startswith("FROM"))
    for tool in ("gcc", "build-essential", "apt-get install", "python3-dev"):
        assert tool not in run, f"{tool} in the final image"
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ignored[0:2] == ["#", "Only"] or "*" in ignored
    assert "!services/" in ignored and "!common/" in ignored


class _ProbeBroker:
    """Enough of a broker for the admin app to be built (its routes listed, none called)."""

    def __init__(self) -> None:
        from magnetar.common.auth.service import AuthenticationService
        from magnetar.common.auth.settings import SecuritySettings

        self.config = SecuritySettings()
        self.authentication = AuthenticationService(self.config)
        self.proxy_roles: frozenset[str] = frozenset()


def _registered_paths(module: Path) -> set[str]:
    """Paths a module registers with ``add_get("/path", ...)``."""
    return set(re.findall(r"add_get\(\s*\"([^\"]+)\"", module.read_text()))
