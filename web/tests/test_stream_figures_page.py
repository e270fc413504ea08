"""The deployment page's stream figures (templates/web/_stream_figures.html): TTFT, ITL, pieces per second, streams
in flight, cancelled and ended by a bound, per revision, for a deployment with a streaming (decoupled) model only, in
the traffic panel and refreshed with the live status."""

from __future__ import annotations

from django.utils import timezone

from deployments.models import Deployment, Revision
from gateway.models import LATENCY_BUCKETS_MS, RequestStats
from tests.support.people import Person, signed_in

PAGE = "/deployments/digits-prod/"


def _streaming(deployment: Deployment) -> None:
    revision = deployment.revision
    assert revision is not None
    data = revision.spec.to_json()
    data["models"][0]["decoupled"] = True
    Revision.objects.filter(pk=revision.pk).update(spec=type(revision.spec).from_json(data))


def _stream_row(deployment: Deployment) -> None:
    first = [0] * len(LATENCY_BUCKETS_MS)
    first[LATENCY_BUCKETS_MS.index(50)] = 10
    gaps = [0] * len(LATENCY_BUCKETS_MS)
    gaps[LATENCY_BUCKETS_MS.index(5)] = 90
    RequestStats.objects.create(deployment=deployment, revision=1, bucket_start=timezone.now(), requests=10,
                                streams=10, stream_pieces=100, stream_seconds=60.0, first_piece_histogram=first,
                                piece_gap_histogram=gaps, stream_ends={"complete": 7, "cancelled": 2,
                                                                       "slow_reader": 1})


def test_a_streaming_deployments_page_shows_its_stream_figures_per_revision(alice: Person,
                                                                             deployment: Deployment) -> None:
    _streaming(deployment)
    _stream_row(deployment)
    client = signed_in(alice)
    content = client.get(PAGE).content.decode()
    assert 'id="stream-figures"' in content and "hx-swap-oob" not in content.split('id="stream-figures"')[1][:40]
    row = content.split('id="stream-figures-r1"')[1].split("</tr>")[0]
    assert ">10<" in row  # streams
    assert "0.20" in row  # 60 stream-seconds over 5 minutes: 0.2 open on average
    assert "0.33" in row  # 100 pieces over 300 s
    assert "slow reader: 1" in row and ">2<" in row  # cancelled
    assert "ms" in content.split('id="stream-figures"')[1].split("</caption>")[0]
    # The live refresh re-sends it out of band.
    live = client.get(f"{PAGE}live/").content.decode()
    assert '<div id="stream-figures" hx-swap-oob="true">' in live


def test_a_deployment_without_a_streaming_model_shows_no_stream_figures(alice: Person, deployment: Deployment) -> None:
    _stream_row(deployment)
    client = signed_in(alice)
    assert 'id="stream-figures"' not in client.get(PAGE).content.decode()
    assert 'id="stream-figures"' not in client.get(f"{PAGE}live/").content.decode()


def test_a_streaming_deployment_with_no_streams_yet_shows_dashes_not_zeros_for_its_percentiles(
        alice: Person, deployment: Deployment) -> None:
    _streaming(deployment)
    content = signed_in(alice).get(PAGE).content.decode()
    row = content.split('id="stream-figures-all"')[1].split("</tr>")[0]
    assert row.count("–") == 3  # TTFT, ITL, no bound ended a stream
