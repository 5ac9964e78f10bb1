"""String ids and namespace values -> Kalos ``u64`` ids and namespaces (shared by the adapters).

Kalos ids and namespaces are unsigned 64-bit integers; LangChain and LlamaIndex use strings.

* **Ids**: ``str_to_u64(s)`` is the 8-byte BLAKE2b digest (``digest_size=8``, read big-endian) of
  ``s.encode("utf-8")``:
  deterministic across processes, platforms and Python versions (unlike ``hash()``, which is
  salted per process). The original string id is stored in the payload JSON and returned from
  there, never reconstructed from the hash. Two different strings collide with probability
  about n²/2⁶⁵ (for a million ids: 3·10⁻⁸); the adapters detect a collision on read (the stored
  string differs) and treat it as "not found".
* **Namespaces**: a metadata value under the configured namespace key maps to a namespace as
  follows: a non-negative ``int`` below 2⁶⁴ is used as is; any other value (a user name, a
  session id, ...) is hashed like an id after ``str()``. ``bool`` is rejected (ambiguous).
"""

from __future__ import annotations

import hashlib
from typing import Any


def str_to_u64(s: str) -> int:
    """Deterministic 64-bit id of a string id (BLAKE2b with digest_size=8, big-endian)."""
    return int.from_bytes(hashlib.blake2b(s.encode("utf-8"), digest_size=8).digest(), "big")


def namespace_of(value: Any) -> int:
    """The Kalos namespace of a metadata value (see the module docstring)."""
    if isinstance(value, bool):
        raise TypeError("a namespace value cannot be a bool")
    if isinstance(value, int) and 0 <= value < 2**64:
        return value
    return str_to_u64(str(value))
