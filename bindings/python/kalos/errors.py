"""Exceptions: one :class:`KalosError` subclass per ``kalos_status`` code.

The classes are made from :data:`kalos._ffi.STATUS_CODES`, which a test compares with the
``KALOS_*`` status constants of ``include/kalos.h``, so a new status code in the header fails the
test suite until it is added here. Names are the status name in CamelCase plus ``Error``
(``SERVER_GONE`` -> :class:`ServerGoneError`). Some classes also derive from the matching
built-in exception so generic ``except ValueError`` / ``except TimeoutError`` handlers work:

* argument errors (``INVALID_ARGUMENT``, ``DIMENSION_MISMATCH``, ``K_OUT_OF_RANGE``,
  ``NON_FINITE``, ``INVALID_NAME``, ``NULL_POINTER``) derive from :class:`ValueError`;
* ``NOT_FOUND`` derives from :class:`LookupError`;
* ``TIMEOUT`` derives from the built-in :class:`TimeoutError` (the Kalos class is exported as
  ``kalos.KalosTimeoutError``); ``IO`` is ``kalos.KalosIOError`` so as not to shadow
  the built-in ``IOError``.
"""

from __future__ import annotations

import builtins
from typing import Dict, Optional, Type

from ._ffi import STATUS_CODES


class KalosError(Exception):
    """Base class of every Kalos error.

    Attributes:
        status: the numeric ``kalos_status`` code (``KALOS_*`` in ``kalos.h``).
        status_name: its stable name, e.g. ``"SERVER_GONE"``.
        message: the library's message (``kalos_last_error()``), starting with the status name.
    """

    status: int = -1
    status_name: str = "UNKNOWN"

    def __init__(self, message: str = "", status: Optional[int] = None) -> None:
        if status is not None:
            self.status = status
        self.message = message or self.status_name
        super().__init__(self.message)

    def __str__(self) -> str:
        return self.message

    def __reduce__(self):  # pragma: no cover - pickling support
        return (type(self), (self.message, self.status))


_BUILTIN_BASES: Dict[str, tuple] = {
    "INVALID_ARGUMENT": (ValueError,),
    "NULL_POINTER": (ValueError,),
    "DIMENSION_MISMATCH": (ValueError,),
    "K_OUT_OF_RANGE": (ValueError,),
    "NON_FINITE": (ValueError,),
    "INVALID_NAME": (ValueError,),
    "NOT_FOUND": (LookupError,),
    "TIMEOUT": (builtins.TimeoutError,),
}

# Python class names that would shadow a builtin get a Kalos prefix.
_CLASS_NAMES = {"TIMEOUT": "KalosTimeoutError", "IO": "KalosIOError"}


def _camel(name: str) -> str:
    return "".join(p.capitalize() for p in name.split("_"))


def class_name(status_name: str) -> str:
    """The Python class name of a status name (``"SERVER_GONE"`` -> ``"ServerGoneError"``)."""
    return _CLASS_NAMES.get(status_name, _camel(status_name) + "Error")


#: status code -> exception class (every code but OK).
ERRORS_BY_STATUS: Dict[int, Type[KalosError]] = {}

for _name, _code in STATUS_CODES.items():
    if _code == 0:
        continue
    _cls = type(
        class_name(_name),
        (KalosError, *_BUILTIN_BASES.get(_name, ())),
        {
            "status": _code,
            "status_name": _name,
            "__doc__": f"``KALOS_{_name}`` ({_code}).",
            "__module__": __name__,
        },
    )
    globals()[_cls.__name__] = _cls
    ERRORS_BY_STATUS[_code] = _cls

del _name, _code, _cls

# Explicit names for type checkers and readers (the loop above defines them).
InvalidArgumentError: Type[KalosError] = globals()["InvalidArgumentError"]
NullPointerError: Type[KalosError] = globals()["NullPointerError"]
DimensionMismatchError: Type[KalosError] = globals()["DimensionMismatchError"]
KOutOfRangeError: Type[KalosError] = globals()["KOutOfRangeError"]
NonFiniteError: Type[KalosError] = globals()["NonFiniteError"]
InvalidNameError: Type[KalosError] = globals()["InvalidNameError"]
StoreFullError: Type[KalosError] = globals()["StoreFullError"]
VersionMismatchError: Type[KalosError] = globals()["VersionMismatchError"]
NotFoundError: Type[KalosError] = globals()["NotFoundError"]
AlreadyExistsError: Type[KalosError] = globals()["AlreadyExistsError"]
KalosTimeoutError: Type[KalosError] = globals()["KalosTimeoutError"]
ServerGoneError: Type[KalosError] = globals()["ServerGoneError"]
BufferTooSmallError: Type[KalosError] = globals()["BufferTooSmallError"]
PayloadTooLargeError: Type[KalosError] = globals()["PayloadTooLargeError"]
CorruptError: Type[KalosError] = globals()["CorruptError"]
KalosIOError: Type[KalosError] = globals()["KalosIOError"]
LockedError: Type[KalosError] = globals()["LockedError"]
BackendUnavailableError: Type[KalosError] = globals()["BackendUnavailableError"]
CudaError: Type[KalosError] = globals()["CudaError"]
PermissionDeniedError: Type[KalosError] = globals()["PermissionDeniedError"]
TooLargeError: Type[KalosError] = globals()["TooLargeError"]
ClosedError: Type[KalosError] = globals()["ClosedError"]
PanicError: Type[KalosError] = globals()["PanicError"]
InternalError: Type[KalosError] = globals()["InternalError"]
#: Cluster mode: the replicated log cannot take a write (the host is cut off from NATS, or the
#: log has no quorum), or no host of a shard answered a forwarded recall.
UnavailableError: Type[KalosError] = globals()["UnavailableError"]
#: Cluster mode: the replica may be behind its log and the recall did not pass
#: ``allow_stale=True``.
StaleError: Type[KalosError] = globals()["StaleError"]


def error_for(status: int, message: str) -> KalosError:
    """The exception instance for a status code and message (unknown codes give KalosError)."""
    cls = ERRORS_BY_STATUS.get(status)
    if cls is None:
        return KalosError(message or f"UNKNOWN status {status}", status)
    return cls(message)
