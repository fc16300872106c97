"""One error type for everything wrong with a checkpoint: the message says what and what to do."""


class CheckpointError(ValueError):
    pass
