"""Exceptions raised at the model-file boundary; each message names the file and the bad value."""


class FormatError(ValueError):
    """A model file, folder or value that cannot be read. Subclasses say which reader."""


class ModelNotFoundError(FormatError):
    """A model alias or path that resolves to nothing."""


class GGUFError(FormatError):
    """A GGUF file that is truncated, has a wrong magic, or a bad tensor or key."""


class SafetensorsError(FormatError):
    """A HF folder or safetensors file that is missing, truncated or inconsistent."""


class QuantError(FormatError):
    """An unknown quant type or raw data whose size does not fit its shape."""


class TokenizerError(FormatError):
    """A tokenizer that cannot be built from the model's vocabulary."""


class ChatTemplateError(FormatError):
    """A missing chat template, or one that fails to render."""
