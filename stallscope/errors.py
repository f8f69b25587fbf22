"""Error types shared by the core and its front ends."""


class StallscopeError(Exception):
    """Base class: an expected failure reported to the user as one line."""


class InputError(StallscopeError):
    """An unreadable, unsupported or malformed input trace (CLI exit code 3).

    The message names the file and the reason, e.g.
    ``"bad.json: truncated JSON (ends inside the event array at byte 1,204)"``.
    """

    def __init__(self, source: str, reason: str):
        self.source = source
        self.reason = reason
        super().__init__(f"{source}: {reason}")


class NotFoundError(StallscopeError):
    """A trace or job id that is not in the store."""


class UsageError(StallscopeError):
    """Arguments that cannot work together (CLI exit code 2, like argparse's own errors)."""
