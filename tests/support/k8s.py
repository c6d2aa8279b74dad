"""The Kubernetes manifests as the tests read them: each overlay rendered by ``kubectl
kustomize`` (Debian's kubectl, installed by scripts/install-test-deps.sh) into plain objects,
with the little a test needs to look them up (containers, environments with their ConfigMaps
resolved, the settings each container passes)."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = ("dev", "production")
WORKLOADS = ("StatefulSet", "Deployment", "Job")


@cache
def render(overlay: str) -> tuple[dict[str, Any], ...]:
    """Every object ``kubectl kustomize`` renders for ``deploy/k8s/overlays/<overlay>``."""
    done = subprocess.run(
        ["kubectl", "kustomize", str(K8S / "overlays" / overlay)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if done.returncode != 0:
        version = subprocess.run(
            ["kubectl", "version", "--client"], capture_output=True, text=True, check=False
        ).stdout
        raise AssertionError(
            f"kubectl kustomize {overlay}: {done.stderr}\n{version}(the manifests keep to what "
            "the kustomize of Debian's kubectl 1.20 reads: `bases`, `patchesStrategicMerge`, "
            "`patchesJson6902`, `configMapGenerator`)"
        )
    return tuple(doc for doc in yaml.safe_load_all(done.stdout) if doc)


@dataclass(frozen=True)
class Manifests:
    objects: tuple[dict[str, Any], ...]

    def get(self, kind: str, name: str) -> dict[str, Any]:
        found = [o for o in self.objects if o["kind"] == kind and o["metadata"]["name"] == name]
        assert len(found) == 1, f"{kind}/{name}: {len(found)} objects"
        return found[0]

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]

    def config_map(self, name: str) -> dict[str, str]:
        """A ConfigMap's data, by the name a workload refers to (hash suffix included)."""
        return dict(self.get("ConfigMap", name).get("data", {}))

    def container(self, workload: dict[str, Any], name: str | None = None) -> dict[str, Any]:
        containers = workload["spec"]["template"]["spec"]["containers"]
        if name is None:
            assert len(containers) == 1
            return containers[0]  # type: ignore[no-any-return]
        return next(c for c in containers if c["name"] == name)

    def environment(self, container: dict[str, Any]) -> dict[str, Any]:
        """The container's variables: envFrom ConfigMaps first, then env (which wins), each
        value a string or, for downward-API values, the ``valueFrom`` mapping."""
        env: dict[str, Any] = {}
        for source in container.get("envFrom", []):
            env.update(self.config_map(source["configMapRef"]["name"]))
        for item in container.get("env", []):
            env[item["name"]] = item["value"] if "value" in item else item["valueFrom"]
        return env


def manifests(overlay: str) -> Manifests:
    return Manifests(render(overlay))
