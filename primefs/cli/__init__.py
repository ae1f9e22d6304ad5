"""The `primefs` command line: `main` (the root group, commands imported when run) and one module per
command family. The top layer: nothing else imports it."""
