"""Pods of rendered manifests run as local processes, the way the kubelet would run them.

Each pod gets its own loopback address (127.A.B.N, A.B drawn per run) standing in for its pod IP, so every pod
listens on the very ports its manifest names. A container runs exactly its manifest's command
and arguments (the image's entrypoint ``magnetar`` when it has no ``command``) with exactly its
environment: ``envFrom`` ConfigMaps, then ``env`` with the downward API (pod name, namespace,
pod IP) and ``$(VAR)`` references expanded as Kubernetes expands them. Two things stand in for
the cluster: DNS names of pods and Services (``bookie-1.bookie.NS.svc``, ``etcd-0.etcd``) are
replaced by the loopback address of the pod behind them, and ``0.0.0.0`` by the pod's own
address; a volume is a directory per pod (a StatefulSet's claims outlive the pod, as retained
PVCs do). Readiness is the manifest's readiness probe, polled; termination runs the preStop
hook, then SIGTERM, then SIGKILL after terminationGracePeriodSeconds."""

from __future__ import annotations

import itertools
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.etcd import find_etcd
from tests.support.k8s import Manifests

#: The image's ENTRYPOINT (the Dockerfile's), as a local command.
ENTRYPOINT = [sys.executable, "-m", "magnetar"]
_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


@dataclass
class Pod:
    name: str
    workload: dict[str, Any]
    ip: str
    env: dict[str, str]
    argv: list[str]
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    #: Figures of its termination: preStop seconds, SIGTERM-to-exit seconds.
    figures: dict[str, float] = field(default_factory=dict)

    @property
    def container(self) -> dict[str, Any]:
        return self.workload["spec"]["template"]["spec"]["containers"][0]  # type: ignore[no-any-return]

    def probe_url(self, kind: str = "readinessProbe") -> str | None:
        probe = self.container.get(kind)
        if probe is None or "httpGet" not in probe:
            return None
        get = probe["httpGet"]
        port = get["port"]
        if isinstance(port, str):
            port = next(p["containerPort"] for p in self.container["ports"] if p["name"] == port)
        return f"http://{self.ip}:{port}{get['path']}"

    def ready(self) -> bool:
        url = self.probe_url()
        if url is None:
            return self.running
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return 200 <= response.status < 400
        except (urllib.error.URLError, OSError):
            return False

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


class PodRunner:
    """Runs the pods of ``manifests`` (one overlay, rendered) under ``base_dir``."""

    def __init__(self, manifests: Manifests, base_dir: Path) -> None:
        self.manifests = manifests
        self.base_dir = base_dir
        self.namespace = next(
            o["metadata"]["namespace"] for o in manifests.objects if "namespace" in o["metadata"]
        )
        self.pods: dict[str, Pod] = {}
        # A loopback /24 of this run's own: the manifests' fixed ports meet no other test's,
        # nor another run of this one.
        self.pod_network = f"127.{random.randint(32, 250)}.{random.randint(0, 255)}."
        self._ips: dict[str, str] = {}
        self._next_ip = itertools.count(2)
        self._deployment_pods = itertools.count()

    # -- addresses -------------------------------------------------------------------------

    def ip_of(self, pod_name: str) -> str:
        if pod_name not in self._ips:
            self._ips[pod_name] = f"{self.pod_network}{next(self._next_ip)}"
        return self._ips[pod_name]

    def _dns(self) -> list[tuple[str, str]]:
        """(name, address) for every StatefulSet pod name a manifest may use, longest first;
        a Service name resolves to its first pod's address."""
        names: list[tuple[str, str]] = []
        ns = self.namespace
        for sts in self.manifests.of_kind("StatefulSet"):
            service = sts["spec"]["serviceName"]
            for ordinal in range(16):
                pod = f"{sts['metadata']['name']}-{ordinal}"
                ip = self.ip_of(pod)
                for suffix in (f".{ns}.svc.cluster.local", f".{ns}.svc", f".{ns}", ""):
                    names.append((f"{pod}.{service}{suffix}", ip))
        return sorted(names, key=lambda item: -len(item[0]))

    def _resolve(self, value: str, own_ip: str) -> str:
        for name, ip in self._dns():
            value = re.sub(rf"(?<![\w.-]){re.escape(name)}(?![\w-])", ip, value)
        return value.replace("0.0.0.0", own_ip)

    # -- pods ------------------------------------------------------------------------------

    def pod_spec(self, workload: dict[str, Any], name: str) -> Pod:
        ip = self.ip_of(name)
        container = workload["spec"]["template"]["spec"]["containers"][0]
        volumes_dir = self.base_dir / "volumes" / name
        mounts = {
            m["mountPath"]: volumes_dir / m["name"] for m in container.get("volumeMounts", [])
        }
        env: dict[str, str] = {}
        for key, value in self.manifests.environment(container).items():
            if isinstance(value, dict):
                path = value["fieldRef"]["fieldPath"]
                value = {
                    "metadata.name": name,
                    "metadata.namespace": self.namespace,
                    "status.podIP": ip,
                }[path]
            else:
                value = _VAR.sub(lambda m: env.get(m[1], m[0]), value)
            env[key] = value
        for key, value in env.items():
            value = self._resolve(value, ip)
            for mount, directory in mounts.items():
                if value == mount or value.startswith(mount + "/"):
                    value = str(directory) + value[len(mount) :]
            env[key] = value
        for directory in mounts.values():
            directory.mkdir(parents=True, exist_ok=True)
        command = container.get("command")
        args = [_VAR.sub(lambda m: env.get(m[1], m[0]), a) for a in container.get("args", [])]
        if command is None:
            argv = [*ENTRYPOINT, *args]
        elif command[0] == "etcd":
            argv = [find_etcd(), *command[1:], *args]
        else:
            argv = [*command, *args]
        log_path = self.base_dir / "logs" / f"{name}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        return Pod(name, workload, ip, env, argv, log_path)

    def process_env(self, pod: Pod) -> dict[str, str]:
        # The container's environment only, plus what a local Python needs to run.
        base = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("MAGNETAR_", "ETCD_")) and k not in ("POD_NAME", "POD_IP")
        }
        return {**base, **pod.env, "HOSTNAME": pod.name}

    def start(self, pod: Pod) -> Pod:
        with open(pod.log_path, "ab") as log:
            pod.process = subprocess.Popen(
                pod.argv,
                env=self.process_env(pod),
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.base_dir,
            )
        pod.started = time.monotonic()
        self.pods[pod.name] = pod
        return pod

    def wait_ready(self, pods: list[Pod], timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        for pod in pods:
            while not pod.ready():
                if not pod.running:
                    raise AssertionError(f"pod {pod.name} exited:\n{pod.log_tail()}")
                if time.monotonic() > deadline:
                    raise AssertionError(f"pod {pod.name} not ready:\n{pod.log_tail()}")
                time.sleep(0.1)

    def run_job(self, job: dict[str, Any], timeout: float = 60.0) -> Pod:
        """Run a Job's pod until it succeeds (restartPolicy OnFailure: again after a failure)."""
        deadline = time.monotonic() + timeout
        pod = self.pod_spec(job, f"{job['metadata']['name']}-{next(self._deployment_pods)}")
        while True:
            self.start(pod)
            assert pod.process is not None
            if pod.process.wait(timeout=timeout) == 0:
                return pod
            assert time.monotonic() < deadline, f"job {pod.name} failed:\n{pod.log_tail()}"
            time.sleep(1)

    def workload(self, kind: str, name: str) -> dict[str, Any]:
        return self.manifests.get(kind, name)

    def scale(self, kind: str, name: str, replicas: int) -> list[Pod]:
        """Set the workload's replicas as an operator would, and act as its controller: new
        pods started (and waited ready, in order for a StatefulSet), surplus ones terminated
        (a StatefulSet's highest ordinals first, a Deployment's newest first). Returns the pods
        started."""
        workload = self.workload(kind, name)
        workload["spec"]["replicas"] = replicas
        mine = [p for p in self.pods.values() if p.workload is workload and p.running]
        mine.sort(key=lambda p: p.started)
        started: list[Pod] = []
        if kind == "StatefulSet":
            mine.sort(key=lambda p: int(p.name.rsplit("-", 1)[1]))
            for ordinal in range(len(mine), replicas):
                pod = self.start(self.pod_spec(workload, f"{name}-{ordinal}"))
                started.append(pod)
                if workload["spec"].get("podManagementPolicy") != "Parallel":
                    self.wait_ready([pod])
        else:
            for _ in range(len(mine), replicas):
                pod_name = f"{name}-{next(self._deployment_pods)}"
                started.append(self.start(self.pod_spec(workload, pod_name)))
        self.wait_ready(started)
        for pod in reversed(mine[replicas:]):
            self.terminate(pod)
        return started

    def terminate(self, pod: Pod) -> int:
        """What the kubelet does: preStop hook (with the container's environment), SIGTERM,
        SIGKILL once terminationGracePeriodSeconds have passed since the start."""
        spec = pod.workload["spec"]["template"]["spec"]
        grace = float(spec.get("terminationGracePeriodSeconds", 30))
        began = time.monotonic()
        hook = pod.container.get("lifecycle", {}).get("preStop", {}).get("exec")
        if hook is not None and pod.running:
            command = list(hook["command"])
            if command[0] == "magnetar":
                command = [*ENTRYPOINT, *command[1:]]
            with open(pod.log_path, "ab") as log:
                log.write(f"--- preStop {hook['command']}\n".encode())
                log.flush()
                hook_done = subprocess.run(
                    command,
                    env=self.process_env(pod),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    timeout=grace,
                    check=False,
                )
            pod.figures["prestop_exit"] = hook_done.returncode
            pod.figures["prestop_s"] = time.monotonic() - began
        assert pod.process is not None
        term = time.monotonic()
        pod.process.send_signal(signal.SIGTERM)
        try:
            code = pod.process.wait(timeout=max(grace - (term - began), 1.0))
        except subprocess.TimeoutExpired:
            pod.process.kill()
            code = pod.process.wait()
            pod.figures["killed"] = 1
        pod.figures["sigterm_to_exit_s"] = time.monotonic() - term
        return code

    def close(self) -> None:
        for pod in self.pods.values():
            if pod.running:
                assert pod.process is not None
                pod.process.kill()
                pod.process.wait()

    def remove_volumes(self) -> None:
        shutil.rmtree(self.base_dir / "volumes", ignore_errors=True)
