"""The embedded model's server: llama.cpp (PyPI xllamacpp) serving SmolLM2 over HTTP on 127.0.0.1.

A process of its own (`python -m primefs.providers.localserver GGUF`), started by the first `local`
call of a process: stopping it is instant whatever it is doing (in-process, tearing the server down
waited for the reply being generated). It prints {"address": ...} on its first line once it answers,
and ends on SIGTERM/SIGINT or when the process that started it is gone.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time

# One slot of 8192 tokens (SmolLM2's training context): every request may use the whole window, and
# requests that come at once wait their turn in the server (two slots sharing one cache overflowed when
# two long prompts came together; on 2 CPUs a second slot only queues anyway). ~330 MB RSS.
N_CTX = 8192
N_PARALLEL = 1
N_THREADS = 2
SERVED_NAME = "smollm2"  # alias the server answers to (instead of the GGUF's full path)


def main(gguf: str) -> None:
    parent = os.getppid()
    for sig in (signal.SIGTERM, signal.SIGINT):  # no destructor: it would wait for a reply in progress
        signal.signal(sig, lambda *_: os._exit(0))
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = gguf
    params.model_alias = {SERVED_NAME}
    params.hostnames = ["127.0.0.1"]
    params.port = 0  # the server binds a free port itself (no pick-then-bind race)
    params.n_ctx = N_CTX
    params.n_parallel = N_PARALLEL
    params.kv_unified = True
    params.cpuparams.n_threads = N_THREADS
    params.cpuparams_batch.n_threads = N_THREADS
    params.ui = False
    params.verbosity = 1  # llama.cpp logs to stderr: errors only (3, the default, is chatty)
    server = xllamacpp.Server(params)  # returns once the model is loaded and listening
    print(json.dumps({"address": server.listening_address.rstrip("/")}), flush=True)
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1])
