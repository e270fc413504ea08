"""The local runtime: real tritonserver processes on the portal's machine, each in a sandbox (deployments.sandbox).

runtime.py is the Runtime the reconciler drives; triton.py supervises one tritonserver process (start, readiness,
logs, stop) with plain functions and no Django.
"""
