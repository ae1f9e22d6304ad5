"""primefs from Python (docs/python-api.md): `Workspace` (ask, submit, sessions), `SessionHandle`, `Result`,
`RLM` (an rlms-style facade) and the exceptions. `import primefs` names them all, imported on first use."""
from primefs.api.rlm import RLM, RLMCompletion
from primefs.api.sessions import Result, SessionHandle
from primefs.api.workspace import Workspace
from primefs.errors import BudgetExceeded, PrimefsError, SessionFailed, Timeout

__all__ = ["Workspace", "SessionHandle", "Result", "RLM", "RLMCompletion", "PrimefsError", "SessionFailed",
           "BudgetExceeded", "Timeout"]
