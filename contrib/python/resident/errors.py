"""The errors of the resident client.

Every error is a ResidentError. An error the daemon answered is an instance
of the class of its code (PROTOCOL.md, "Errors"), with .code the protocol's
code string and .message the daemon's English text. Errors on this side of
the socket (ConnectError, ConnectionLost, ProtocolError) have .code None.
"""


class ResidentError(Exception):
    """Base of every error of this package. .code: the protocol's error code
    string, or None for an error on this side of the socket."""

    code = None

    def __init__(self, message, code=None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def __str__(self):
        return "%s (%s)" % (self.message, self.code) if self.code else self.message


class ConnectError(ResidentError):
    """Cannot connect: residentd is not running, or the socket is not ours."""


class ConnectionLost(ResidentError):
    """The connection to residentd broke or was closed; the client is unusable."""


class ProtocolError(ResidentError):
    """residentd sent something this package cannot read."""


class BadFrame(ResidentError):
    code = "bad_frame"


class FrameTooLarge(ResidentError):
    code = "frame_too_large"


class BadRequest(ResidentError):
    code = "bad_request"


class UnknownOp(ResidentError):
    code = "unknown_op"


class InvalidParam(ResidentError):
    code = "invalid_param"


class InvalidUtf8(ResidentError):
    code = "invalid_utf8"


class ContextExceeded(ResidentError):
    code = "context_exceeded"


class NotFound(ResidentError):
    code = "not_found"


class DuplicateId(ResidentError):
    code = "duplicate_id"


class Overloaded(ResidentError):
    code = "overloaded"


class ModelError(ResidentError):
    code = "model_error"


class ShuttingDown(ResidentError):
    code = "shutting_down"


class InternalError(ResidentError):
    code = "internal"


class QuotaExceeded(ResidentError):
    code = "quota_exceeded"


class StorageFull(ResidentError):
    code = "storage_full"


class SessionBusy(ResidentError):
    code = "session_busy"


class FrameTimeout(ResidentError):
    code = "frame_timeout"


class Cancelled(ResidentError):
    code = "cancelled"


_BY_CODE = {cls.code: cls for cls in (
    BadFrame, FrameTooLarge, BadRequest, UnknownOp, InvalidParam, InvalidUtf8, ContextExceeded,
    NotFound, DuplicateId, Overloaded, ModelError, ShuttingDown, InternalError, QuotaExceeded,
    StorageFull, SessionBusy, FrameTimeout, Cancelled)}


def from_reply(reply):
    """The exception for an `error` reply: its code's class, or ResidentError
    carrying a code this package does not know (a newer daemon)."""
    code = reply.get("code")
    message = reply.get("message") or code or "unknown error"
    cls = _BY_CODE.get(code)
    if cls is None:
        return ResidentError(message, code if isinstance(code, str) else None)
    return cls(message)
