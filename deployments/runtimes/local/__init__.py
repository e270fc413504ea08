"""The local runtime: real tritonserver processes on the portal's machine, each in a sandbox (modelport.core.sandbox).

runtime.py is the Runtime the reconciler drives (a dedicated server per revision; pool.py a pool's shared one); both
start their Tritons through confined.py (the sandbox's settings and refusal, limits, names, log bounds), which asks
pyenv.py for the python environment a revision runs with and files.py where its repository is rendered; policy.py
holds check_plan's rules and sweeps.py the periodic clean-up. With plain functions and no Django, triton.py
supervises one tritonserver process (start, find, stop, reap) started with backends.py's backend directory,
readiness.py tells whether it is ready with its models, serverlog.py writes its log through the keeper
(logkeeper.py) and reads its errors and tail. The runtime env it runs from is the core's (modelport.core.runtime_env).
"""
