"""User-facing errors: the CLI prints them as one line, without a traceback."""


class PrimefsError(Exception):
    """A mistake in input or setup that the user can fix; the message says how."""


class SessionStopping(Exception):
    """The session was stopped or the runner is stopping: no more model calls are paid for."""


class BudgetExhausted(Exception):
    """A budget of the session tree ran out; `reason` is `budget:<turns|tokens|seconds|cost_usd>`."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


# -- the Python API's exceptions (primefs.api): each a PrimefsError, so the CLI prints it as one line --
class SessionFailed(PrimefsError):
    """A session ended without an answer: it failed or was stopped. `result` says how (primefs.api.Result)."""

    def __init__(self, message: str, result=None):
        super().__init__(message)
        self.result = result


class BudgetExceeded(SessionFailed):
    """A budget of the session's tree ran out (`result.stop_reason` is `budget:<what>`)."""


class Timeout(PrimefsError, TimeoutError):
    """The wait ended before the session did. `handle` is the session, still going on under its runner."""

    def __init__(self, message: str, handle=None):
        super().__init__(message)
        self.handle = handle
