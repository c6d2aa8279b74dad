"""A real Magnetar cluster for tests: one etcd, N bookie processes and M ``magnetar broker``
processes, each broker on its own free ports with its log in a file.

:class:`BrokerProcess` can be killed (SIGKILL), paused (SIGSTOP), resumed (SIGCONT), stopped
(SIGTERM) and restarted on the same ports. :class:`MagnetarCluster` starts everything (bookies
and brokers in parallel) and reads the cluster's state straight from the metadata store:
registered brokers (``/magnetar/brokers/``), the load manager's leader
(``/magnetar/elections/load-manager/leader``) and bundle ownership
(``/magnetar/ownership/{tenant}/{ns}/{bundle}``), so tests do not depend on admin endpoints
for what the store already says. :func:`assert_no_traceback` checks a broker's log.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import pulsar

from magnetar.broker.cluster.bundles import BundleRange, topic_hash
from magnetar.broker.cluster.ownership import OWNERSHIP_ROOT
from magnetar.common.cluster.broker_info import BROKERS_ROOT, BrokerInfo
from magnetar.common.metadata import open_store
from magnetar.common.metadata.election import leader_key
from magnetar.common.metadata.etcd import EtcdTls
from tests.support.etcd import REPO_ROOT, EtcdServer, free_port
from tests.support.ledger_cluster import LedgerCluster
from tests.support.process import ServiceProcess

START_TIMEOUT_SECONDS = 30.0
LEADER_ELECTION = "load-manager"

T = TypeVar("T")


class BrokerProcess(ServiceProcess):
    """One ``python -m magnetar.cli broker`` process.

    ``settings`` are extra ``magnetar broker`` options keyed by config field name; a bool
    becomes ``--x`` / ``--no-x``. The Pulsar and HTTP ports are picked once and kept across
    restarts, so a restarted broker has the same broker id (``127.0.0.1:<http port>``).
    """

    def __init__(
        self,
        base_dir: Path,
        metadata_url: str,
        *,
        settings: Mapping[str, object] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        base_dir.mkdir(parents=True, exist_ok=True)
        self.base_dir = base_dir
        self.metadata_url = metadata_url
        self.settings: dict[str, object] = dict(settings or {})
        self.env = dict(env or {})
        self.port = free_port()
        self.http_port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    # -- addresses ---------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"pulsar://127.0.0.1:{self.port}"

    @property
    def broker_id(self) -> str:
        """The id the broker registers under and lookups name (Pulsar's ``host:http_port``)."""
        return f"127.0.0.1:{self.http_port}"

    @property
    def log_path(self) -> Path:
        return self.base_dir / "broker.log"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    # -- life cycle --------------------------------------------------------------------

    def command(self) -> list[str]:
        cmd = [
            sys.executable, "-m", "magnetar.cli", "broker",
            "--metadata-url", self.metadata_url,
            "--bind-address", "127.0.0.1", "--advertised-address", "127.0.0.1",
            "--port", str(self.port), "--http-port", str(self.http_port),
        ]  # fmt: skip
        for name, value in self.settings.items():
            option = "--" + name.replace("_", "-")
            if isinstance(value, bool):
                cmd.append(option if value else "--no-" + name.replace("_", "-"))
            else:
                cmd += [option, str(value)]
        return cmd

    stop_timeout = 30.0  # SIGTERM unloads every bundle first

    def describe(self) -> str:
        return f"broker {self.broker_id}"

    def spawn(self) -> None:
        """Start the process without waiting for it to serve."""
        if self.running:
            return
        self.starts += 1
        with open(self.log_path, "ab") as log_file:
            log_file.write(f"--- start #{self.starts}: {' '.join(self.command())}\n".encode())
            log_file.flush()
            self.process = subprocess.Popen(
                self.command(),
                cwd=REPO_ROOT,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **self.env},
                start_new_session=True,
            )

    def wait_serving(self, timeout: float = START_TIMEOUT_SECONDS) -> None:
        """Wait until the Pulsar port accepts connections and ``/health`` answers 200."""
        assert self.process is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(
                    f"broker {self.broker_id} exited with code {self.process.returncode} during "
                    f"startup:\n{self.log_tail()}"
                )
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    pass
                if self.http("GET", "/health", timeout=2)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise AssertionError(
            f"broker {self.broker_id} did not serve within {timeout}s:\n{self.log_tail()}"
        )

    def start(self) -> BrokerProcess:
        self.spawn()
        self.wait_serving()
        return self

    # -- HTTP --------------------------------------------------------------------------

    def http(
        self, method: str, path: str, body: Any = None, timeout: float = 30.0
    ) -> tuple[int, bytes]:
        """(status, body) of one request to this broker's HTTP port; a 307/308 redirect (admin
        calls for a bundle or topic go to its owner, as in Pulsar) is followed for any method."""
        return http_request(method, self.http_url + path, body, timeout)

    # -- logs --------------------------------------------------------------------------

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return "(no broker log)"

    def log_tail(self, chars: int = 6000) -> str:
        return self.log_text()[-chars:]

    def log_lines(self, *needles: str) -> list[str]:
        """Lines of the log holding any of ``needles``."""
        return [line for line in self.log_text().splitlines() if any(n in line for n in needles)]


def http_request(
    method: str, url: str, body: Any = None, timeout: float = 30.0, redirects: int = 5
) -> tuple[int, bytes]:
    """(status, body) of one HTTP request; 307/308 redirects followed with the same method."""
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"} if data is not None else {}
    request = urllib.request.Request(url, method=method, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as e:
        location = e.headers.get("Location")
        if e.code in (307, 308) and location and redirects > 0:
            target = urllib.parse.urljoin(url, location)
            return http_request(method, target, body, timeout, redirects - 1)
        return e.code, e.read()


def assert_no_traceback(broker: BrokerProcess) -> None:
    """The broker logged no Python traceback (every error it met was handled and said so)."""
    text = broker.log_text()
    index = text.find("Traceback")
    assert index < 0, (
        f"broker {broker.broker_id} logged a Traceback ({broker.log_path}):\n"
        f"{text[max(0, index - 1500) : index + 4000]}"
    )


#: Broker settings for tests: short reports so placement sees fresh load, no shedding or
#: splitting during a test unless it asks.
TEST_BROKER_SETTINGS: dict[str, object] = {
    "ensemble_size": 2,
    "write_quorum": 2,
    "ack_quorum": 2,
    "broker_session_ttl_seconds": 10,
    "load_balancer_report_update_interval_seconds": 1,
    "load_balancer_shedding_interval_seconds": 3600,
    "load_balancer_auto_bundle_split_enabled": False,
    "keep_alive_interval_seconds": 5,
}


def _run(coro_factory: Callable[[], Any]) -> Any:
    """Run a coroutine from sync code, in a thread of its own (safe inside an event loop)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: asyncio.run(coro_factory())).result()


class MagnetarCluster(LedgerCluster):
    """etcd + ``bookies`` bookie processes (a LedgerCluster) + ``brokers`` broker processes."""

    def __init__(
        self,
        base_dir: Path,
        *,
        bookies: int = 3,
        brokers: int = 3,
        broker_settings: Mapping[str, object] | None = None,
        bookie_settings: Mapping[str, object] | None = None,
        etcd: EtcdServer | None = None,
        store_tls: EtcdTls | None = None,
    ) -> None:
        super().__init__(
            base_dir / "bookies", bookies, etcd=etcd, store_tls=store_tls, **(bookie_settings or {})
        )
        self.base_dir = base_dir
        self.broker_settings = {**TEST_BROKER_SETTINGS, **(broker_settings or {})}
        self.brokers: list[BrokerProcess] = []
        self._broker_count = brokers

    def start(self) -> MagnetarCluster:
        super().start()
        for _ in range(self._broker_count):
            self.add_broker(start=False)
        for broker in self.brokers:
            broker.spawn()
        for broker in self.brokers:
            broker.wait_serving()
        self.wait_for(
            lambda: (
                set(self.registered()) >= {b.broker_id for b in self.brokers}
                and self.leader() is not None
            ),
            what="every broker registered and a leader elected",
        )
        return self

    def add_broker(self, *, start: bool = True, **settings: object) -> BrokerProcess:
        broker = BrokerProcess(
            self.base_dir / f"broker-{len(self.brokers)}",
            self.url,
            settings={**self.broker_settings, **settings},
        )
        self.brokers.append(broker)
        if start:
            broker.start()
        return broker

    def close(self) -> None:
        try:
            for broker in self.brokers:
                try:
                    broker.stop()
                except AssertionError:
                    pass  # stop() fell back to SIGKILL
        finally:
            super().close()

    def __enter__(self) -> MagnetarCluster:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- lookups by process ---------------------------------------------------------------

    def broker(self, broker_id: str) -> BrokerProcess:
        for b in self.brokers:
            if b.broker_id == broker_id:
                return b
        raise KeyError(f"no broker {broker_id}: {[b.broker_id for b in self.brokers]}")

    def running_brokers(self) -> list[BrokerProcess]:
        return [b for b in self.brokers if b.running]

    # -- metadata store -------------------------------------------------------------------

    def scan(self, prefix: str) -> dict[str, bytes]:
        async def read() -> dict[str, bytes]:
            store = await open_store(self.url, tls=self.store_tls)
            try:
                return {k: v.value for k, v in (await store.scan(prefix)).items()}
            finally:
                await store.close()

        return _run(read)

    def delete(self, key: str) -> None:
        async def remove() -> None:
            store = await open_store(self.url, tls=self.store_tls)
            try:
                await store.delete(key)
            finally:
                await store.close()

        _run(remove)

    def registered(self) -> dict[str, dict[str, Any]]:
        """Registered brokers: broker id -> registration document (info and load report)."""
        return {
            key.removeprefix(BROKERS_ROOT + "/"): json.loads(value)
            for key, value in self.scan(BROKERS_ROOT + "/").items()
        }

    def leader(self) -> str | None:
        """Broker id of the load manager's leader (None while there is none)."""
        found = self.scan(leader_key(LEADER_ELECTION))
        for value in found.values():
            return BrokerInfo.from_json(value).broker_id
        return None

    def ownership(self) -> dict[tuple[str, str], str]:
        """Every owned bundle: (tenant/ns, bundle range) -> owner's broker id."""
        owned: dict[tuple[str, str], str] = {}
        for key, value in self.scan(OWNERSHIP_ROOT + "/").items():
            tenant, ns, bundle = key.removeprefix(OWNERSHIP_ROOT + "/").split("/")
            owned[(f"{tenant}/{ns}", bundle)] = BrokerInfo.from_json(value).broker_id
        return owned

    def owner_of_topic(self, topic: str) -> str | None:
        """Owner of the bundle holding ``topic`` (full name), by Pulsar's hash."""
        name = topic.split("://", 1)[1]
        tenant, ns, _ = name.split("/", 2)
        namespace = f"{tenant}/{ns}"
        h = topic_hash(topic)
        for (owned_ns, bundle), owner in self.ownership().items():
            if owned_ns == namespace and BundleRange.parse(bundle).contains(h):
                return owner
        return None

    # -- admin ----------------------------------------------------------------------------

    def admin(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """One admin call to the first running broker; the body decoded as JSON if it is."""
        broker = self.running_brokers()[0]
        status, raw = broker.http(method, path, body)
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, raw.decode(errors="replace")

    def create_namespace(self, tenant: str, namespace: str) -> None:
        status, body = self.admin("PUT", f"/admin/v2/tenants/{tenant}", {})
        assert status in (204, 409), f"create tenant {tenant}: {status} {body!r}"
        status, body = self.admin("PUT", f"/admin/v2/namespaces/{tenant}/{namespace}")
        assert status in (204, 409), f"create namespace {tenant}/{namespace}: {status} {body!r}"

    def admin_json(self, method: str, path: str, body: Any = None) -> Any:
        """An admin call that must succeed (2xx); its JSON body (None when empty)."""
        status, answer = self.admin(method, path, body)
        assert 200 <= status < 300, f"{method} {path}: HTTP {status} {answer!r}"
        return answer

    def unload_bundle(self, namespace: str, bundle: str) -> None:
        """``PUT /admin/v2/namespaces/{t}/{ns}/{bundle}/unload`` (redirected to the owner)."""
        self.admin_json("PUT", f"/admin/v2/namespaces/{namespace}/{bundle}/unload")

    def http_lookup(self, topic: str, broker: BrokerProcess | None = None) -> dict[str, Any]:
        """``GET /lookup/v2/topic/persistent/{t}/{ns}/{topic}`` on ``broker`` (or the first
        running one): ``{"brokerUrl": ..., "httpUrl": ...}``."""
        path = "/lookup/v2/topic/" + topic.replace("://", "/", 1)
        target = broker or self.running_brokers()[0]
        status, raw = target.http("GET", path)
        assert status == 200, f"lookup of {topic} on {target.broker_id}: {status} {raw!r}"
        return json.loads(raw)

    # -- waiting --------------------------------------------------------------------------

    def wait_for(
        self, condition: Callable[[], T], *, what: str, timeout: float = 30.0, every: float = 0.2
    ) -> T:
        deadline = time.monotonic() + timeout
        while True:
            result = condition()
            if result:
                return result
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"timed out after {timeout}s waiting for: {what}\n{self.logs()}"
                )
            time.sleep(every)

    def logs(self, chars: int = 3000) -> str:
        return "\n".join(
            f"===== broker {b.broker_id} ({b.log_path}) =====\n{b.log_tail(chars)}"
            for b in self.brokers
        )


def cluster_fixture(base_dir: Path, **options: Any) -> Iterator[MagnetarCluster]:
    """Body of a module-scoped cluster fixture; broker logs' tails are printed at teardown."""
    cluster = MagnetarCluster(base_dir, **options)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()
        print(cluster.logs())


# -- traffic ---------------------------------------------------------------------------------

_ORDER = itertools.count()  # one clock for every consumer: next() is atomic under the GIL


class PacedProducer:
    """Async sends with callbacks from a thread: payloads ``{tag}-{n:06}``, key ``k{n % keys}``.

    ``receipted`` maps each acknowledged payload to when its receipt arrived; ``errors`` holds
    every send whose callback reported a failure (the application-visible errors).
    """

    def __init__(
        self,
        client: pulsar.Client,
        topic: str,
        *,
        tag: str = "m",
        keys: int = 8,
        interval: float = 0.005,
        max_in_flight: int = 100,
        send_timeout_ms: int = 30_000,
    ) -> None:
        self.topic = topic
        self.tag = tag
        self.keys = keys
        self.interval = interval
        self.producer = client.create_producer(
            topic,
            batching_enabled=False,
            send_timeout_millis=send_timeout_ms,
            block_if_queue_full=True,
        )
        self.sent: list[str] = []
        self.receipted: dict[str, float] = {}
        self.errors: list[tuple[str, str]] = []
        self.raised: list[tuple[str, str]] = []
        self._in_flight = threading.Semaphore(max_in_flight)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"producer {topic}", daemon=True)

    def key_of(self, n: int) -> str:
        return f"k{n % self.keys}"

    def start(self) -> PacedProducer:
        self._thread.start()
        return self

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            if not self._in_flight.acquire(timeout=0.5):
                continue
            body = f"{self.tag}-{n:06}"
            key = self.key_of(n)
            n += 1
            try:
                self.producer.send_async(body.encode(), self._callback(body), partition_key=key)
            except Exception as e:  # the client refused the send itself
                self._in_flight.release()
                with self._lock:
                    self.raised.append((body, repr(e)))
                continue
            with self._lock:
                self.sent.append(body)
            time.sleep(self.interval)

    def _callback(self, body: str) -> Callable[[Any, Any], None]:
        def done(result: Any, _message_id: Any) -> None:
            self._in_flight.release()
            with self._lock:
                if result == pulsar.Result.Ok:
                    self.receipted[body] = time.monotonic()
                else:
                    self.errors.append((body, str(result)))

        return done

    def wait_for(self, more: int, timeout: float = 30.0) -> None:
        """Wait until ``more`` further messages are receipted (production goes on)."""
        self.wait_until(len(self.receipted) + more, time.monotonic() + timeout)

    def wait_until(self, target: int, deadline: float) -> None:
        """Wait until ``target`` messages in all are receipted; fail at ``deadline``."""
        while len(self.receipted) < target:
            assert time.monotonic() < deadline, (
                f"{self.topic}: production stalled at {len(self.receipted)} receipts "
                f"(sent {len(self.sent)}, errors {self.errors[-5:]}, raised {self.raised[-5:]})"
            )
            time.sleep(0.05)

    def stop(self, timeout: float = 60.0) -> None:
        """Stop sending and wait for every callback of what was sent."""
        self._stop.set()
        self._thread.join(10)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if len(self.receipted) + len(self.errors) >= len(self.sent):
                    break
            time.sleep(0.05)
        try:
            self.producer.flush()
        except Exception as e:
            self.raised.append(("flush", repr(e)))

    def close(self) -> None:
        try:
            self.producer.close()
        except Exception:
            pass  # closing after a broker died: nothing to keep


def wait_for_each(producers: Sequence[PacedProducer], more: int, timeout: float = 30.0) -> None:
    """Wait until each producer has ``more`` further messages receipted, counted from now for
    all of them at once (waiting for one after the other would count each from when the
    previous one was done)."""
    deadline = time.monotonic() + timeout
    targets = [len(p.receipted) + more for p in producers]
    for producer, target in zip(producers, targets, strict=True):
        producer.wait_until(target, deadline)


@dataclass(slots=True, frozen=True)
class Delivery:
    payload: str
    key: str
    order: int  # global receive order across every consumer of the test
    received: float  # time.time() at its receipt


class ConsumerThread:
    """One consumer receiving and acknowledging from a thread; keeps every delivery."""

    def __init__(
        self,
        client: pulsar.Client,
        topic: str,
        subscription: str,
        consumer_type: pulsar.ConsumerType,
        *,
        name: str | None = None,
    ) -> None:
        self.subscription = subscription
        self.consumer = client.subscribe(
            topic,
            subscription,
            consumer_type=consumer_type,
            initial_position=pulsar.InitialPosition.Earliest,
            consumer_name=name,
        )
        self.deliveries: list[Delivery] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"consumer {name}", daemon=True)

    def start(self) -> ConsumerThread:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                message = self.consumer.receive(timeout_millis=200)
            except pulsar.Timeout:
                continue
            except Exception as e:
                self.errors.append(repr(e))
                time.sleep(0.1)
                continue
            self.deliveries.append(
                Delivery(
                    message.data().decode(), message.partition_key(), next(_ORDER), time.time()
                )
            )
            try:
                self.consumer.acknowledge(message)
            except Exception as e:
                self.errors.append(f"ack: {e!r}")

    def payloads(self) -> set[str]:
        return {d.payload for d in self.deliveries}

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def close(self) -> None:
        self.stop()
        try:
            self.consumer.close()
        except Exception:
            pass


def wait_delivered(
    consumers: list[ConsumerThread], wanted: set[str], *, timeout: float = 60.0
) -> set[str]:
    """Wait until the consumers together received every payload of ``wanted``; the missing
    ones (empty when all came)."""
    deadline = time.monotonic() + timeout
    while True:
        got: set[str] = set()
        for consumer in consumers:
            got |= consumer.payloads()
        missing = wanted - got
        if not missing or time.monotonic() > deadline:
            return missing
        time.sleep(0.2)


def first_delivery_order_violations(deliveries: list[Delivery]) -> list[str]:
    """Per key, the first deliveries (redeliveries of a payload seen before left out) must come
    in the order the payloads were produced; the violations found."""
    seen: set[str] = set()
    last: dict[str, str] = {}
    violations = []
    for d in sorted(deliveries, key=lambda d: d.order):
        if d.payload in seen:
            continue
        seen.add(d.payload)
        previous = last.get(d.key)
        if previous is not None and d.payload < previous:
            violations.append(f"key {d.key}: {d.payload} after {previous}")
        last[d.key] = max(previous or "", d.payload)
    return violations
