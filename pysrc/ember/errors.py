"""The exceptions ember raises, one hierarchy for the engine and the API layer.

They are defined by the native module (so Rust errors cross the boundary
typed) and re-exported here, with the Python-only ones beside them.
"""

from ember._native import ContextFullError, DeviceError, EmberError, InvalidRequestError, ModelLoadError

__all__ = [
    "EmberError",
    "ModelLoadError",
    "InvalidRequestError",
    "ContextFullError",
    "DeviceError",
    "TemplateError",
    "ModelFetchError",
]


class TemplateError(EmberError):
    """A chat template failed to parse or render (including its own raise_exception)."""


class ModelFetchError(EmberError):
    """The default model could not be fetched."""
