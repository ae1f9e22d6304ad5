"""Kernels: the seam the runner reaches them through (host), the runner's client of one kernel,
local kernels forked from a template process, the sandbox, and kernels on a Ray cluster."""
