"""TF Serving's error model: a canonical status code and a message, for REST and gRPC alike.

TF Serving answers every failure with a status (``INVALID_ARGUMENT``, ``NOT_FOUND``, ...) and
a message; its REST API writes the message as ``{"error": "<message>"}`` with the HTTP status
of that code, its gRPC API as the call's status. `StatusError` carries both, so one decision
serves both protocols.
"""

from __future__ import annotations

import re

# TF Serving's http_rest_api_handler: canonical code -> HTTP status.
HTTP_STATUS = {
    "CANCELLED": 499,
    "UNKNOWN": 500,
    "INVALID_ARGUMENT": 400,
    "DEADLINE_EXCEEDED": 504,
    "NOT_FOUND": 404,
    "ALREADY_EXISTS": 409,
    "PERMISSION_DENIED": 403,
    "RESOURCE_EXHAUSTED": 429,
    "FAILED_PRECONDITION": 400,
    "ABORTED": 409,
    "OUT_OF_RANGE": 400,
    "UNIMPLEMENTED": 501,
    "INTERNAL": 500,
    "UNAVAILABLE": 503,
    "DATA_LOSS": 500,
    "UNAUTHENTICATED": 401,
}


class StatusError(Exception):
    """A request TF Serving would refuse: `code` is the canonical status name."""

    def __init__(self, code: str, message: str) -> None:
        if code not in HTTP_STATUS:
            raise ValueError(f"unknown status code {code!r}")
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def http_status(self) -> int:
        return HTTP_STATUS[self.code]


def invalid_argument(message: str) -> StatusError:
    return StatusError("INVALID_ARGUMENT", message)


def not_found(message: str) -> StatusError:
    return StatusError("NOT_FOUND", message)


def failed_precondition(message: str) -> StatusError:
    return StatusError("FAILED_PRECONDITION", message)


def from_tensorflow(exc: Exception) -> StatusError:
    """The status TF Serving would answer when running the model raised `exc`.

    TensorFlow's runtime errors carry the same canonical codes (an `OpError`'s class name is
    the code in CamelCase); a Python-side refusal to bind the inputs (wrong dtype or shape for
    the signature) is what TF Serving reports as INVALID_ARGUMENT.
    """
    import tensorflow as tf

    if isinstance(exc, tf.errors.OpError):
        name = _OP_ERROR_CODES.get(type(exc).__name__, "INVALID_ARGUMENT")
        return StatusError(name, _op_error_text(str(exc.message)))
    first = str(exc).strip().splitlines()
    return invalid_argument(first[0] if first else type(exc).__name__)


def _op_error_text(message: str) -> str:
    """The line of a TensorFlow runtime error that says what was wrong, and the op it was in.

    Eager calls wrap the runtime's message in "Graph execution error: Detected at node ...";
    TF Serving reports the runtime's own message ("Input shapes do not match: [2] vs. [1]",
    "Feature: island (data type: string) is required but could not be found.").
    """
    node = re.search(r"\[\[\{\{node ([^}]+)\}\}\]\]", message)
    asserted = re.search(r"assertion failed: \[(.*?)\]", message)
    if asserted:  # the serving signatures' own checks (tf.debugging.Assert): their message only
        return asserted.group(1)
    lines = [
        line.strip()
        for line in message.splitlines()
        if line.strip()
        and not line.strip().startswith(
            ("Graph execution error", "Detected at node", "<stack", "[[")
        )
    ]
    detail = next((line for line in lines if "Key:" in line or "Feature:" in line), None)
    detail = detail or (lines[0] if lines else "the model refused the input")
    return f"{detail} [[{{{{node {node.group(1)}}}}}]]" if node else detail


_OP_ERROR_CODES = {
    "CancelledError": "CANCELLED",
    "UnknownError": "UNKNOWN",
    "InvalidArgumentError": "INVALID_ARGUMENT",
    "DeadlineExceededError": "DEADLINE_EXCEEDED",
    "NotFoundError": "NOT_FOUND",
    "AlreadyExistsError": "ALREADY_EXISTS",
    "PermissionDeniedError": "PERMISSION_DENIED",
    "ResourceExhaustedError": "RESOURCE_EXHAUSTED",
    "FailedPreconditionError": "FAILED_PRECONDITION",
    "AbortedError": "ABORTED",
    "OutOfRangeError": "OUT_OF_RANGE",
    "UnimplementedError": "UNIMPLEMENTED",
    "InternalError": "INTERNAL",
    "UnavailableError": "UNAVAILABLE",
    "DataLossError": "DATA_LOSS",
    "UnauthenticatedError": "UNAUTHENTICATED",
}
