"""The Kubernetes runtime: Triton pods on a cluster.

runtime.py is the Runtime the reconciler drives; beside it plain modules with no Django: config.py (the settings as
one value), manifests.py (the objects of a revision), kube.py (the API client), status.py (what pods say, in words),
s3repo.py (the model repository in S3) and fetch_repository.py (what the pods' init container runs).
"""
