"""The registered brokers, as the metadata store says (``BROKERS_ROOT``), kept current by a watch.

The proxy knows brokers only from here: lookups start at one of them (round-robin), a relay
target must be one of them (never an address a client names, CVE-2022-24280), and when a
broker's registration disappears - it died, or it froze and its session lease ran out - every
connection the proxy holds to it is closed at once, so clients reconnect through the proxy to
the bundle's next owner within the session TTL instead of waiting for their own keep-alive.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from magnetar.common.cluster.broker_info import BROKERS_ROOT, BrokerInfo, registered_broker
from magnetar.common.metadata import MetadataStore
from magnetar.common.metadata.election import cancel_and_wait
from magnetar.common.metadata.prefix_cache import PrefixCache

log = logging.getLogger(__name__)

#: Waits before following the registrations again after their watch ended (doubling).
RETRY_SECONDS = 1.0
MAX_RETRY_SECONDS = 30.0


class NoBrokerAvailable(LookupError):
    """No broker is registered."""


@dataclass(slots=True, frozen=True)
class Address:
    """A broker's binary protocol address, as ``proxy_to_broker_url`` names it (``host:port``)."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"

    @classmethod
    def parse(cls, value: str) -> Address:
        """``host:port``, ``[v6]:port`` or a ``pulsar://`` / ``pulsar+ssl://`` URL
        (``ValueError`` for anything else)."""
        text = value.strip()
        if "://" not in text:
            text = "pulsar://" + text
        parts = urlsplit(text)
        if parts.scheme not in ("pulsar", "pulsar+ssl") or parts.path not in ("", "/"):
            raise ValueError(f"not a broker address: {value!r}")
        try:
            port = parts.port
        except ValueError:
            raise ValueError(f"not a broker address: {value!r}") from None
        if not parts.hostname or port is None:
            raise ValueError(f"not a broker address (host:port): {value!r}")
        return cls(parts.hostname.lower(), port)


def broker_addresses(info: BrokerInfo) -> list[Address]:
    """The binary protocol addresses a registered broker serves on (plain and TLS)."""
    found = []
    for url in (info.service_url, info.service_url_tls):
        if url:
            try:
                found.append(Address.parse(url))
            except ValueError:
                log.warning("broker %s registered an unusable URL %r", info.broker_id, url)
    return found


class BrokerDirectory:
    """The registered brokers (``brokers()``, ``pick()``, ``is_registered()``) and who wants to
    know when one's registration disappears (``on_gone``)."""

    def __init__(self, store: MetadataStore) -> None:
        self._store = store
        self._known: dict[str, BrokerInfo] = {}
        self._addresses: dict[Address, str] = {}  # address -> registration key
        self._listeners: list[Callable[[BrokerInfo], None]] = []
        self._turn = itertools.count()
        self._cache = self._new_cache()
        self._closed = False
        self._rewatch: asyncio.Task[None] | None = None

    def _new_cache(self) -> PrefixCache:
        return PrefixCache(
            self._store, BROKERS_ROOT + "/", on_change=self._changed, on_end=self._watch_ended
        )

    async def start(self) -> None:
        await self._cache.start()
        log.info(
            "brokers registered: %s",
            ", ".join(info.broker_id for info in self.brokers()) or "none yet",
        )

    async def close(self) -> None:
        self._closed = True
        if self._rewatch is not None:
            await cancel_and_wait(self._rewatch)
        await self._cache.close()

    def on_gone(self, listener: Callable[[BrokerInfo], None]) -> None:
        """``listener(info)`` runs when a broker's registration is deleted (or expires)."""
        self._listeners.append(listener)

    def brokers(self) -> list[BrokerInfo]:
        return [self._known[key] for key in sorted(self._known)]

    def pick(self) -> BrokerInfo:
        """The next registered broker, round-robin (``NoBrokerAvailable`` when none is)."""
        brokers = self.brokers()
        if not brokers:
            raise NoBrokerAvailable("no broker is registered in the metadata store")
        return brokers[next(self._turn) % len(brokers)]

    def is_registered(self, host: str, port: int) -> bool:
        """Whether ``host:port`` is a registered broker's plain or TLS address."""
        return Address(host.lower(), port) in self._addresses

    def broker_at(self, address: Address) -> BrokerInfo | None:
        key = self._addresses.get(address)
        return self._known.get(key) if key is not None else None

    def _changed(self, key: str, value: bytes | None, version: int) -> None:
        previous = self._known.pop(key, None)
        if previous is not None:
            for address in broker_addresses(previous):
                if self._addresses.get(address) == key:
                    del self._addresses[address]
        if value is None:
            if previous is not None:
                log.info("broker %s is no longer registered", previous.broker_id)
                for listener in list(self._listeners):
                    try:
                        listener(previous)
                    except Exception:
                        log.exception("listener of broker %s's departure", previous.broker_id)
            return
        try:
            info = registered_broker(value)
        except ValueError as e:
            log.warning("ignoring registration %s: %s", key, e)
            return
        self._known[key] = info
        for address in broker_addresses(info):
            self._addresses[address] = key
        if previous is None:
            log.info("broker %s registered (%s)", info.broker_id, info.service_url)

    def _watch_ended(self) -> None:
        if self._closed or self._rewatch is not None:
            return
        log.warning("the watch of broker registrations ended; following them again")
        self._rewatch = asyncio.get_running_loop().create_task(
            self._follow_again(), name="broker registrations"
        )

    async def _follow_again(self) -> None:
        """A new watch and scan; brokers that left meanwhile are reported gone as if seen."""
        delay = RETRY_SECONDS
        try:
            while not self._closed:
                await asyncio.sleep(delay)
                cache = self._new_cache()
                try:
                    await cache.start()
                except Exception as e:
                    delay = min(delay * 2, MAX_RETRY_SECONDS)
                    log.warning(
                        "cannot follow broker registrations (again in %.0f s): %s", delay, e
                    )
                    continue
                old, self._cache = self._cache, cache
                self._rewatch = None  # from here an end of the new watch starts another round
                await old.close()
                present = set(cache.items())
                for key in set(self._known) - present:
                    self._changed(key, None, 0)
                log.info(
                    "following broker registrations again: %s",
                    ", ".join(info.broker_id for info in self.brokers()) or "none",
                )
                return
        finally:
            if self._rewatch is asyncio.current_task():
                self._rewatch = None
