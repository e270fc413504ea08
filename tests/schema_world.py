"""The world the schema tests run against (tests/test_schema_fuzz.py, tests/test_schema_access.py): alice's team
with a model, deployments and a token, charlie's with his own, and what would give charlie's objects away. A module of
its own, so that the fuzz tests (collected only when they run: schemathesis builds their cases at collection) and the
access test of the fast suite share one world (the `world` fixture, tests/conftest.py)."""

from __future__ import annotations

from tests.support.people import Person, make_person

# alice's token for the run, made in World with this value. It may manage tokens, so that the token endpoints are
# reached beyond their 403.
FUZZ_TOKEN = "mp_f0220000_schemathesis-fuzzing-token-of-alice-in-acme"

# Charlie's team and what it holds: no answer to alice may contain any of it. Long, odd names, so that no name the
# fuzzer makes up for alice can be one of them.
CHARLIE_MODEL = "globex-hidden-model-q7x2"
CHARLIE_DEPLOYMENT = "globex-hidden-deploy-q7x2"


class World:
    """alice (admin of acme) with a ready model, a deployment on each runtime and a token that may manage tokens;
    charlie (admin of globex) with a model, a deployment and a token of his own."""

    def __init__(self) -> None:
        from datetime import timedelta

        from django.utils import timezone

        from accounts.models import ApiToken, hash_token
        from models_registry.models import Upload
        from tests.support.versions import make_ready_version

        self.alice = make_person("alice", "acme", role="admin")
        self.charlie = make_person("charlie", "globex", role="admin")
        # Its id is out of the fuzzer's usual range, so that a random DELETE /api/v1/tokens/{id}/ does not revoke it
        # mid-run.
        ApiToken.objects.create(id=987_654_321, user=self.alice.user, team=self.alice.team, name="fuzz",
                                prefix=FUZZ_TOKEN.split("_")[1], digest=hash_token(FUZZ_TOKEN), scopes=["tokens"])
        make_ready_version(self.alice)
        for name, runtime in (("digits", "local"), ("digits-k8s", "kubernetes")):
            self._deploy(self.alice, name, runtime, "digits")
        self._traffic(self.alice, "digits")
        make_ready_version(self.charlie, name=CHARLIE_MODEL)
        self._deploy(self.charlie, CHARLIE_DEPLOYMENT, "local", CHARLIE_MODEL)
        upload = Upload.objects.create(team=self.charlie.team, created_by=self.charlie.user, length=10,
                                       expires_at=timezone.now() + timedelta(days=1))
        # What would give charlie's objects away: their names, his team, his token's prefix, his upload.
        self.secrets = [CHARLIE_MODEL, CHARLIE_DEPLOYMENT, "globex", "charlie",
                        ApiToken.objects.get(user=self.charlie.user).prefix, str(upload.pk)]

    @staticmethod
    def _deploy(person: Person, name: str, runtime: str, model: str) -> None:
        response = person.client().post("/api/v1/deployments/", {
            "name": name, "runtime": runtime, "models": [{"model": model}]}, format="json")
        assert response.status_code == 201, response.json()

    @staticmethod
    def _traffic(person: Person, name: str) -> None:
        """A bucket of gateway statistics with streams, so that the metrics answer's every section (percentiles,
        revisions, stream figures) is held to its schema with figures in it, not only with nulls."""
        from django.utils import timezone

        from deployments.models import Deployment
        from gateway.models import LATENCY_BUCKETS_MS, RequestStats

        histogram = [0] * len(LATENCY_BUCKETS_MS)
        histogram[5] = 4
        RequestStats.objects.create(
            deployment=Deployment.objects.get(team=person.team, name=name), revision=1, bucket_start=timezone.now(),
            requests=4, errors=1, latency_sum_ms=20.0, latency_histogram=histogram, codes={"200": 3, "504": 1},
            streams=4, stream_pieces=40, stream_seconds=12.5, first_piece_histogram=histogram,
            piece_gap_histogram=[count * 9 for count in histogram], stream_ends={"complete": 2, "cancelled": 1,
                                                                                 "idle": 1})
        # Two snapshots of Triton's statistics, so that the performance answer has its figures too (and its advice),
        # and a bucket between them of the model called, for its gateway figures.
        from datetime import timedelta

        RequestStats.objects.create(
            deployment=Deployment.objects.get(team=person.team, name=name), revision=1, model="digits",
            bucket_start=timezone.now() - timedelta(minutes=2), requests=4, errors=1, latency_sum_ms=40.0,
            latency_histogram=histogram, codes={"200": 3, "503": 1})

        from performance.models import TritonSnapshot

        deployment = Deployment.objects.get(team=person.team, name=name)
        for minutes, requests in ((3, 100), (1, 400)):
            TritonSnapshot.objects.create(deployment=deployment, revision=1,
                                          taken_at=timezone.now() - timedelta(minutes=minutes), counters={"digits": {
                                              "d": {"success": [requests, requests * 9_000_000],
                                                    "queue": [requests, requests * 8_000_000],
                                                    "compute_infer": [requests, requests * 1_000_000]},
                                              "b": {"1": requests // 2, "2": requests // 4},
                                              "e": requests * 3 // 4, "i": requests}})

    def leaks(self, text: str) -> list[str]:
        return [secret for secret in self.secrets if secret in text]
