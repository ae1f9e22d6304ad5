"""User-facing errors: the CLI prints them as one line, without a traceback."""


class PrimefsError(Exception):
    """A mistake in input or setup that the user can fix; the message says how."""
