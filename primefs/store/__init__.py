"""The workspace's files: the truth every other part reads and writes. Sessions, histories, mail,
goals, heartbeats, settings, trust, the committer, summaries, and the files through which the
command line reaches the runner (control). Nothing here imports SQLite, kernels or the runner."""
