"""Python client of fastack, the event pipeline server.

    from fastack import Client, AsyncClient, Tracker, ApiError
    from fastack.webhooks import verify          # standard library only
    from fastack.amqp import verify              # standard library only

- `Client`: the API, blocking; `AsyncClient`: the same with coroutines.
- `Tracker`: fire-and-forget track/identify, batched in the background.
- `ApiError`: every error answer (`status`, `code`, `detail`, `errors`).

Names are imported lazily, so `fastack.webhooks` and `fastack.amqp` load
nothing but the standard library.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._errors import (
    ApiError,
    EventTooLarge,
    FastackError,
    Forbidden,
    ProblemField,
    QueueFull,
    TrackerClosed,
    TrackerError,
    TransportError,
    Unauthorized,
    Undelivered,
)
from ._signature import SignatureError
from ._version import __version__

if TYPE_CHECKING:
    from ._client import AsyncClient, Client
    from ._tracker import FlushResult, Tracker, TrackerStats

__all__ = [
    "ApiError",
    "AsyncClient",
    "Client",
    "EventTooLarge",
    "FastackError",
    "FlushResult",
    "Forbidden",
    "ProblemField",
    "QueueFull",
    "SignatureError",
    "Tracker",
    "TrackerClosed",
    "TrackerError",
    "TrackerStats",
    "TransportError",
    "Unauthorized",
    "Undelivered",
    "__version__",
]

_LAZY = {
    "Client": "._client",
    "AsyncClient": "._client",
    "Tracker": "._tracker",
    "TrackerStats": "._tracker",
    "FlushResult": "._tracker",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'fastack' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
