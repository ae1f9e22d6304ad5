"""The continual harness: notes, memories, skills and subagent specs as files, one git commit per
change (with provenance), its log read back from git, and refine.

The names below are the harness API (docs/harness.md): `from primefs.harness import Harness`."""
from primefs.harness.entries import (
                                     Harness,
                                     commit_user_edits,
                                     log,
                                     record_outcome,
                                     render_for_prompt,
                                     revert,
                                     session_chain,
)

__all__ = ["Harness", "commit_user_edits", "log", "record_outcome", "render_for_prompt", "revert",
           "session_chain"]
