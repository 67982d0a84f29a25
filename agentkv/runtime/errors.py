"""Errors the engine raises at its boundary (the server maps them to 4xx).

A request that is refused raises one of the ValueError subclasses below from `validate` /
`add_request`, and nothing of it stays registered. A request that fails later, inside a step
(a logits row that is not finite, a grammar that allows no token, a tokenizer or stop-string
error), does not raise: it ends alone with a `RequestOutput` whose `finish_reason` is
"error" and whose `error` holds the message; the other requests of the batch go on.
"""


class PromptTooLongError(ValueError):
    """A prompt (plus at least one generated token) that does not fit the context."""

    def __init__(self, prompt_len: int, max_model_len: int):
        self.prompt_len, self.max_model_len = prompt_len, max_model_len
        super().__init__(
            f"prompt has {prompt_len} tokens but the model's context is "
            f"{max_model_len} tokens (max_model_len); shorten the prompt"
        )


class InvalidTokenError(ValueError):
    """A prompt token id outside the model's vocabulary."""


class KVCapacityError(ValueError):
    """A prompt + max_tokens that needs more KV blocks than the whole pool holds: it could
    never run, however long it waited."""

    def __init__(self, prompt_len: int, max_tokens: int, num_needed: int, num_blocks: int, block_size: int):
        self.prompt_len, self.max_tokens = prompt_len, max_tokens
        self.num_needed, self.num_blocks = num_needed, num_blocks
        super().__init__(
            f"prompt ({prompt_len} tokens) + max_tokens ({max_tokens}) needs {num_needed} KV "
            f"blocks of {block_size} tokens, but the whole KV pool has {num_blocks} blocks "
            f"({num_blocks * block_size} tokens); lower max_tokens or the prompt, or raise "
            f"--kv-cache-blocks / --kv-cache-memory"
        )


class NotAGeneratorError(ValueError):
    """Generation asked of an embedding model."""

    def __init__(self, model_name: str):
        self.model_name = model_name
        super().__init__(f"{model_name} is an embedding model; it does not generate")


class EngineDeadError(RuntimeError):
    """The engine thread stopped after an internal error; requests cannot be served."""


class QueueFullError(RuntimeError):
    """Admission refused: as many requests as may run plus wait are in flight already. Not
    the request's fault; the same request may succeed later (the server answers 429)."""

    def __init__(self, num_in_flight: int, limit: int):
        self.num_in_flight, self.limit = num_in_flight, limit
        super().__init__(
            f"the server is at capacity: {num_in_flight} requests in flight, "
            f"limit {limit} (max_num_seqs + max_queued_requests); retry later"
        )


class StreamStalledError(RuntimeError):
    """A reader left its request's output unread past the bound; the request was ended so its
    KV and its place in the batch go to readers that keep up."""

    def __init__(self, stall_s: float):
        self.stall_s = stall_s
        super().__init__(f"the client read nothing of this stream for over {stall_s:g} s; the request was ended")
