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
