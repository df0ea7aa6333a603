"""resident: a client of residentd, the local LLM inference daemon, written
from its protocol (PROTOCOL.md: msgpack frames over a Unix socket).

    import resident

    with resident.connect() as c:                      # blocking
        for tok in c.generate(messages=[{"role": "user", "content": "Hi"}]):
            print(tok.text, end="", flush=True)

    c = await resident.aio.connect()                   # asyncio
    gen = await c.generate(prompt="Once upon a time", max_tokens=32)
    async for tok in gen:
        ...
    print(gen.done.usage)

Errors are ResidentError subclasses carrying the protocol's error code
(resident.errors).
"""
from . import aio, errors
from ._wire import PROTOCOL_VERSION, Choice, Done, Token, default_socket
from .client import Client, Generation, connect
from .errors import (BadFrame, BadRequest, Cancelled, ConnectError, ConnectionLost, ContextExceeded, DuplicateId,
                     FrameTimeout, FrameTooLarge, InternalError, InvalidParam, InvalidUtf8, ModelError, NotFound,
                     Overloaded, ProtocolError, QuotaExceeded, ResidentError, SessionBusy, ShuttingDown,
                     StorageFull, UnknownOp)

__version__ = "0.1.0"

__all__ = [
    "aio", "errors", "PROTOCOL_VERSION", "Choice", "Done", "Token", "default_socket", "Client", "Generation",
    "connect", "BadFrame", "BadRequest", "Cancelled", "ConnectError", "ConnectionLost", "ContextExceeded",
    "DuplicateId", "FrameTimeout", "FrameTooLarge", "InternalError", "InvalidParam", "InvalidUtf8", "ModelError",
    "NotFound", "Overloaded", "ProtocolError", "QuotaExceeded", "ResidentError", "SessionBusy",
    "ShuttingDown", "StorageFull", "UnknownOp",
]
