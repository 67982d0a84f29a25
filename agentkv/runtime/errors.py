"""Errors the engine raises at its boundary (the server maps them to 4xx)."""


class PromptTooLongError(ValueError):
    """A prompt (plus at least one generated token) that does not fit the context."""

    def __init__(self, prompt_len: int, max_model_len: int):
        self.prompt_len, self.max_model_len = prompt_len, max_model_len
        super().__init__(f"prompt has {prompt_len} tokens but the model's context is "
                         f"{max_model_len} tokens (max_model_len); shorten the prompt")


class InvalidTokenError(ValueError):
    """A prompt token id outside the model's vocabulary."""


class EngineDeadError(RuntimeError):
    """The engine thread stopped after an internal error; requests cannot be served."""
