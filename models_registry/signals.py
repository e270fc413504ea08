"""Questions the registry asks of the apps above it, as signals: it sits below deployments and never imports them."""

from __future__ import annotations

from django.dispatch import Signal

# Who serves this version (keyword argument: version)? Each receiver returns a list of names that keep it from
# being deleted (deployments/usage.py answers with its deployments).
version_users = Signal()

# Call this python model once (keyword arguments: archive, signature, timeout) and judge the answer: a TrialCall
# (models_registry/python_trial.py); deployments/runtimes/local/trial_call.py answers with a sandboxed Triton of
# the model's own.
python_trial_call = Signal()
