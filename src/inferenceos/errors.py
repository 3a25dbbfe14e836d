"""Errors a user can act on.

Every exception that derives from `InferenceOSError` carries a message meant to be shown
as is, on one line, by the CLI and the server. Anything else escaping to the top level is
a bug in InferenceOS, not a user error.
"""


class InferenceOSError(Exception):
    """Base of all user-facing errors; `str(exc)` is a complete one-line message."""

    exit_code = 1


class ModelNotFoundError(InferenceOSError):
    """The named model file or registry entry does not exist or cannot be read."""


class GGUFFormatError(InferenceOSError):
    """A GGUF file is malformed, truncated, or uses a feature we do not support."""


class ModelLoadError(InferenceOSError):
    """llama.cpp refused to load a model or create a context for it."""


class GenerationError(InferenceOSError):
    """Generation failed inside llama.cpp (decode error, context overflow, ...)."""


class UsageError(InferenceOSError):
    """The user asked for something contradictory or out of range."""

    exit_code = 2


class EngineBusyError(InferenceOSError):
    """The engine's request queue is full; retry later (HTTP 429)."""


class WorkerDiedError(GenerationError):
    """The model's worker process died; in-flight requests end with this error."""


class StorageError(InferenceOSError):
    """A database the runtime keeps is unusable now (corrupt, locked past its wait, on a
    full disk); the message names the file. HTTP 503: nothing the client did wrong."""


class MediaError(InferenceOSError):
    """An image or audio input was refused: too large, of an unsupported type, corrupt,
    or from a source the server does not fetch (HTTP 400; the message says which)."""


class Interrupted(InferenceOSError):
    """The user pressed Ctrl-C before there was anything to show (exit 130, as a shell
    reports a command ended by SIGINT)."""

    exit_code = 130
