"""The id hashing is what bindings/python/README.md says: BLAKE2b with digest_size=8, big-endian."""

import hashlib

from kalos._ids import str_to_u64


def test_string_ids_hash_as_documented():
    for s in ("a", "user-42", "é🍵"):
        want = int.from_bytes(hashlib.blake2b(s.encode("utf-8"), digest_size=8).digest(), "big")
        assert str_to_u64(s) == want
        # Not a truncation of the 64-byte digest (a different function).
        assert str_to_u64(s) != int.from_bytes(hashlib.blake2b(s.encode("utf-8")).digest()[:8], "big")
