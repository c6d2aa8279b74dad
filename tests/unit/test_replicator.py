"""Geo-replication's pure parts and its producer client (issue 25): what a replicator sends for
a stored entry (``replicator.outgoing_entry``), and ``ProducerClient`` against an in-process
fake broker speaking the frames (CONNECT with credentials, LOOKUP redirect, PRODUCER, SEND and
receipts, a connection lost with sends pending)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from magnetar.broker.model.entry import entry_metadata, entry_payload
from magnetar.broker.model.topic_name import TopicName
from magnetar.broker.namespace.clusters import ClusterData
from magnetar.broker.topics.replicator import (
    ReplicationContext,
    Replicator,
    cursor_name,
    is_replicator_cursor,
    outgoing_entry,
)
from magnetar.common.proto import pulsar_api_pb2 as pb
from magnetar.common.protocol import codec
from magnetar.common.protocol.producer_client import ProducerClient, ProducerClientError
from magnetar.common.tasks import wait_set


def stored(**fields: object) -> bytes:
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=7, publish_time=1, **fields)
    return codec.encode_headers_and_payload(metadata, b"payload")


def test_an_entry_is_sent_marked_with_the_local_cluster() -> None:
    out = outgoing_entry(stored(), "east", "west")
    assert out is not None
    section, count = out
    metadata = entry_metadata(section)
    assert metadata.replicated_from == "east"
    assert (metadata.producer_name, metadata.sequence_id) == ("p", 7)
    assert entry_payload(section) == b"payload" and count == 1


def test_replicated_entries_are_never_sent_again() -> None:
    assert outgoing_entry(stored(replicated_from="north"), "east", "west") is None


def test_replicate_to_is_honoured() -> None:
    assert outgoing_entry(stored(replicate_to=["north"]), "east", "west") is None
    assert outgoing_entry(stored(replicate_to=["west"]), "east", "west") is not None
    assert outgoing_entry(stored(replicate_to=["__local__"]), "east", "west") is None


def test_replicator_cursors_are_named_apart() -> None:
    assert is_replicator_cursor("pulsar.repl.west")
    assert not is_replicator_cursor("my-subscription")


class FakeBroker:
    """Answers CONNECT, LOOKUP (first a redirect to ``redirect_to`` if set), PRODUCER and SEND."""

    def __init__(self, *, redirect_to: str = "", drop_after: int = -1) -> None:
        self.redirect_to = redirect_to
        self.drop_after = drop_after
        self.connects: list[pb.CommandConnect] = []
        self.sends: list[tuple[int, bytes]] = []
        self.server: asyncio.AbstractServer | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"pulsar://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        decoder = codec.FrameDecoder()
        while data := await reader.read(65536):
            for frame in decoder.feed(data):
                body = frame.body
                if frame.name == "CONNECT":
                    self.connects.append(body)
                    writer.write(
                        codec.encode_command(
                            pb.CommandConnected(server_version="fake", protocol_version=19)
                        )
                    )
                elif frame.name == "LOOKUP":
                    answer = pb.CommandLookupTopicResponse(
                        request_id=body.request_id, response=pb.CommandLookupTopicResponse.Connect
                    )
                    if self.redirect_to:
                        answer.response = pb.CommandLookupTopicResponse.Redirect
                        answer.brokerServiceUrl = self.redirect_to
                    writer.write(codec.encode_command(answer))
                elif frame.name == "PRODUCER":
                    writer.write(
                        codec.encode_command(
                            pb.CommandProducerSuccess(
                                request_id=body.request_id, producer_name=body.producer_name
                            )
                        )
                    )
                elif frame.name == "SEND":
                    if len(self.sends) == self.drop_after:
                        writer.close()
                        return
                    self.sends.append((body.sequence_id, bytes(frame.headers_and_payload)))
                    writer.write(
                        codec.encode_send_receipt(
                            body.producer_id, body.sequence_id, 1, len(self.sends)
                        )
                    )
            await writer.drain()

    async def close(self) -> None:
        assert self.server is not None
        self.server.close()


def test_producer_client_follows_a_redirect_and_gets_receipts_in_order() -> None:
    async def run() -> None:
        owner = FakeBroker()
        owner_url = await owner.start()
        entry = FakeBroker(redirect_to=owner_url)
        entry_url = await entry.start()
        client = ProducerClient(
            entry_url,
            "persistent://t/ns/x",
            "pulsar.repl.east",
            auth_method="token",
            auth_data=b"jwt",
        )
        await client.start()
        futures = [client.send(i, stored()) for i in range(1, 6)]
        ids = await asyncio.gather(*futures)
        assert [m.entryId for m in ids] == [1, 2, 3, 4, 5]
        assert [s for s, _ in owner.sends] == [1, 2, 3, 4, 5]
        assert [c.auth_method_name for c in entry.connects + owner.connects] == ["token", "token"]
        assert owner.connects[0].auth_data == b"jwt"
        await client.close()
        await owner.close()
        await entry.close()

    asyncio.run(run())


def test_a_lost_connection_fails_every_pending_send() -> None:
    async def run() -> None:
        broker = FakeBroker(drop_after=2)
        client = ProducerClient(await broker.start(), "persistent://t/ns/x", "pulsar.repl.east")
        await client.start()
        futures = [client.send(i, stored()) for i in range(1, 5)]
        results = await asyncio.gather(*futures, return_exceptions=True)
        assert [isinstance(r, pb.MessageIdData) for r in results[:2]] == [True, True]
        assert all(isinstance(r, ProducerClientError) for r in results[2:])
        assert not client.connected
        with pytest.raises(ProducerClientError):
            await asyncio.wait_for(client.send(9, stored()), 1)
        await client.close()
        await broker.close()

    asyncio.run(run())


class IdleCursor:
    """A replicator's cursor with nothing to read: the replicator waits for a wake-up."""

    backlog = 0

    def rewind(self) -> None:
        pass

    async def read_entries(self, count: int) -> list[object]:
        return []


@pytest.mark.parametrize("turns", range(6))
def test_a_stop_is_never_lost_when_a_wake_up_comes_with_it(turns: int) -> None:
    """The unload of a bundle hung for ever (once in about 30 loaded runs): the replicator was
    woken by the topic's last add in the very turns its stop cancelled it, ``asyncio.wait_for``
    (Python 3.11) returned the wake-up and dropped the cancellation, and the replicator went on
    waiting and reading while ``stop`` waited for it. Each step of that race is tried here."""

    async def run() -> None:
        broker = FakeBroker()
        url = await broker.start()
        topic = SimpleNamespace(
            name=TopicName.parse("persistent://t/ns/x"),
            ml=SimpleNamespace(cursors={cursor_name("west"): IdleCursor()}),
        )

        async def find_cluster(name: str) -> ClusterData:
            return ClusterData(broker_service_url=url)

        replicator = Replicator(topic, "west", ReplicationContext("east", find_cluster))  # type: ignore[arg-type]
        replicator.start()
        for _ in range(500):  # connected to the fake broker within 5 s
            if replicator.connected:
                break
            await asyncio.sleep(0.01)
        assert replicator.connected
        await asyncio.sleep(0.05)  # waiting for a wake-up now
        replicator.wake()
        for _ in range(turns):
            await asyncio.sleep(0)
        await asyncio.wait_for(replicator.stop(), 3)
        assert not replicator.connected
        await broker.close()

    asyncio.run(run())


@pytest.mark.parametrize("turns", range(6))
def test_wait_set_keeps_a_cancellation_that_comes_with_the_event(turns: int) -> None:
    async def run() -> None:
        event = asyncio.Event()
        woken: list[bool] = []

        async def loop() -> None:
            while True:
                woken.append(await wait_set(event, 10))
                event.clear()

        task = asyncio.create_task(loop())
        await asyncio.sleep(0.01)
        event.set()
        for _ in range(turns):
            await asyncio.sleep(0)
        task.cancel()
        await asyncio.wait([task], timeout=1)
        assert task.cancelled()
        assert woken in ([], [True])

    asyncio.run(run())
