"""What runs inside a kernel: the names the model's code uses (api), its tools, its snapshots and the
client of the runner's socket (rpc). Never imports the runner: tests/unit/test_layers.py checks it."""
