"""Errors of the engines package.

EngineError
├── UnknownModel        a model name the catalog does not have
├── ZooError            fetching, verifying or converting a model failed
│   ├── ChecksumMismatch    a downloaded file whose sha256 is not the catalog's
│   └── CacheDirError       the cache directory cannot be created or written
├── BadPrompt           malformed messages or generation parameters
├── PromptTooLong       a prompt (plus max tokens) beyond the model's context
├── EngineBusy          the engine's queue is full; retry later
└── KVMismatch          a KV value made by another model, or inconsistent with the prompt
"""


class EngineError(Exception):
    """Base of every error raised by ``engines``."""


class UnknownModel(EngineError):
    pass


class ZooError(EngineError):
    pass


class ChecksumMismatch(ZooError):
    pass


class CacheDirError(ZooError):
    pass


class BadPrompt(EngineError):
    pass


class PromptTooLong(EngineError):
    pass


class EngineBusy(EngineError):
    pass


class KVMismatch(EngineError):
    pass
