"""The runner: the parts that turn files into work (intake, scheduler, post office, turns, the model
gateway, services for kernels, goal control, heartbeats), and `core`, which builds and wires them."""
