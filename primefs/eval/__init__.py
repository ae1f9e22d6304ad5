"""`primefs eval`: benchmark items run as RLM sessions and/or direct prompts, recorded, repeated, reported."""
