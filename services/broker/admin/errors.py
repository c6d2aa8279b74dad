"""The admin API's one error path: handlers raise :class:`AdminError`; the :func:`errors`
middleware answers it, and the broker's own exceptions, as Pulsar does: its status code and a
``{"reason": ...}`` body. An unexpected exception is logged once with the request and answered
500 with a reason, so every request gets an answer."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from magnetar.broker.errors import NamespaceNotFoundError, TopicNotFoundError, TopicNotOwnedError
from magnetar.broker.model.topic_name import InvalidTopicNameError

log = logging.getLogger(__name__)


class AdminError(Exception):
    """Answered as ``{"reason": ...}`` with this HTTP status."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def error_response(status: int, reason: str, headers: dict[str, str] | None = None) -> web.Response:
    """Pulsar's admin API answers errors as ``{"reason": ...}``."""
    return web.json_response({"reason": reason}, status=status, headers=headers)


@web.middleware
async def errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Every failure becomes Pulsar's status and ``{"reason": ...}``."""
    try:
        return await handler(request)
    except AdminError as e:
        return error_response(e.status, e.reason)
    except InvalidTopicNameError as e:
        return error_response(412, f"Topic name is not valid: {e}")
    except NamespaceNotFoundError as e:  # deleted between our check and the topic's load
        return error_response(404, f"Namespace does not exist: {e}")
    except TopicNotFoundError as e:
        return error_response(404, str(e))
    except TopicNotOwnedError as e:
        # Pulsar: a topic's admin calls are answered by its owner; others redirect there.
        if e.owner is None:
            return error_response(503, str(e))
        raise web.HTTPTemporaryRedirect(f"{e.owner.http_url}{request.path_qs}") from None
    except web.HTTPException as e:
        if e.status < 400:
            raise
        # aiohttp's own answers (no such path, method not allowed, body too large), same shape.
        allow = e.headers.get("Allow")
        return error_response(e.status, e.reason, {"Allow": allow} if allow else None)
    except Exception as e:
        log.exception("admin %s %s failed", request.method, request.path)
        return error_response(500, f"internal error: {type(e).__name__}: {e}")
