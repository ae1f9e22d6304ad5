"""`primefs eval`: benchmark items run as RLM sessions and/or direct prompts, recorded, repeated, reported."""


def run_gate(*args, **kw):
    """primefs.eval.gate.run_gate, imported on first use: the programs that run a runner hand it over."""
    from primefs.eval.gate import run_gate as run

    return run(*args, **kw)
