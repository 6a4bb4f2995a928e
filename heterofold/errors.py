"""Errors of the method package.

HeteroFoldError
├── KVFormatError          a KV value or payload that is malformed or of another format
│   └── KVChecksumError    a payload whose bytes do not match its checksum
├── AdapterError           an adapter that cannot be built, loaded or applied
│   └── FingerprintMismatch    an adapter or KV value made for another model
└── TaskFormatError        a task file (JSONL) that cannot be read as evaluation items
"""


class HeteroFoldError(Exception):
    """Base of every error raised by ``heterofold``."""


class KVFormatError(HeteroFoldError):
    pass


class KVChecksumError(KVFormatError):
    pass


class AdapterError(HeteroFoldError):
    pass


class FingerprintMismatch(AdapterError):
    pass


class TaskFormatError(HeteroFoldError):
    pass
