"""Error types shared by the core and its front ends."""


class StallscopeError(Exception):
    """Base class: an expected failure reported to the user as one line."""

    def __reduce__(self):
        """Pickle as class, message and attributes (subclasses' ``__init__`` take other arguments):
        an error raised in a worker process arrives in the parent as the same class and text."""
        return _restore, (type(self), self.args, dict(self.__dict__))


def _restore(cls: type, args: tuple, state: dict) -> StallscopeError:
    error = cls.__new__(cls)
    Exception.__init__(error, *args)
    error.__dict__.update(state)
    return error


class InputError(StallscopeError):
    """An unreadable, unsupported or malformed input trace (CLI exit code 3).

    The message names the file and the reason, e.g.
    ``"bad.json: truncated JSON (ends inside the event array at byte 1,204)"``.
    """

    def __init__(self, source: str, reason: str):
        self.source = source
        self.reason = reason
        super().__init__(f"{source}: {reason}" if source else reason)


class NotFoundError(StallscopeError):
    """A trace or job id that is not in the store."""


class UsageError(StallscopeError):
    """Arguments that cannot work together (CLI exit code 2, like argparse's own errors)."""


class EnvironmentProblem(StallscopeError):
    """The machine, not the input, stopped the command (CLI exit code 4).

    A read-only store, a permission denied, a full disk (ENOSPC) or quota, or
    a store file that is damaged on disk. The message says which path and why.
    """


class StoreFileCorrupt(EnvironmentProblem):
    """A file of one stored job is unreadable (truncated, damaged): only that job is affected."""


def error_for_exit(code: int, message: str) -> StallscopeError:
    """The error class a ``stallscope`` exit code stands for, with its one-line message:
    2 :class:`UsageError`, 3 :class:`InputError`, 4 or a signal (negative)
    :class:`EnvironmentProblem`, else :class:`StallscopeError`."""
    if code == 2:
        return UsageError(message)
    if code == 3:
        return InputError("", message)
    if code == 4 or code < 0:
        return EnvironmentProblem(message)
    return StallscopeError(message)


# errno values that say "this machine or its disks", never "this input".
_ENVIRONMENT_ERRNOS = {"EROFS", "EACCES", "EPERM", "ENOSPC", "EDQUOT", "EMFILE", "ENFILE", "EIO"}


_ERRNO_TEXT = {"ENOSPC": "No space left on device", "EROFS": "Read-only file system",
               "EACCES": "Permission denied", "EDQUOT": "quota exceeded"}  # fmt: skip


def environment_problem(exc: OSError, doing: str = "") -> EnvironmentProblem | None:
    """An :class:`EnvironmentProblem` for an OSError of the machine (read-only, denied, full), else None."""
    import errno

    name = errno.errorcode.get(exc.errno or 0, "")
    if not name:  # Arrow's and DuckDB's I/O errors carry only the text
        text = str(exc)
        name = next((n for n, words in _ERRNO_TEXT.items() if words in text), "")
    if name not in _ENVIRONMENT_ERRNOS:
        return None
    what = {
        "EROFS": "the file system is read-only",
        "EACCES": "permission denied",
        "EPERM": "operation not permitted",
        "ENOSPC": "no space left on the device (disk full)",
        "EDQUOT": "disk quota exceeded",
        "EMFILE": "too many open files",
        "ENFILE": "too many open files on the system",
        "EIO": "input/output error from the disk",
    }[name]
    where = f" ({exc.filename})" if exc.filename else ""
    prefix = f"cannot {doing}: " if doing else ""
    return EnvironmentProblem(f"{prefix}{what}{where}")
