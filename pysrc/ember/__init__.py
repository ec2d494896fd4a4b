"""ember: local LLM inference on GGUF models, with its own Rust kernels.

    import ember
    model = ember.Model()            # the default model, fetched once
    print(model.generate("Once upon a time", 32))
"""

from ember._native import __version__
from ember.errors import (
    ContextFullError,
    DeviceError,
    EmberError,
    InvalidRequestError,
    ModelFetchError,
    ModelLoadError,
    TemplateError,
)
from ember.model import Completion, Model, Piece
from ember.sampling import SamplingParams

__all__ = [
    "__version__",
    "Model",
    "Completion",
    "Piece",
    "SamplingParams",
    "EmberError",
    "ModelLoadError",
    "InvalidRequestError",
    "ContextFullError",
    "DeviceError",
    "TemplateError",
    "ModelFetchError",
]
