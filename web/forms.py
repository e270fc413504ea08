"""Forms of the web pages. Django forms parse what the browser sends (numbers, check boxes, lists typed as text) and
bound it as the API's serializers do; what a deployment may be stays in one place, deployments.planning, whose
field-keyed errors are put back beside the form field they concern."""

from __future__ import annotations

import re
from typing import Any

from django import forms
from django.conf import settings

from accounts.models import SCOPE_TOKENS, max_token_lifetime_days
from deployments import canary, planning
from deployments.ceilings import MAX_GPUS, MAX_REPLICAS
from deployments.models import Deployment
from deployments.planning import MAX_IDLE_UNLOAD_SECONDS
from deployments.revision_spec import ModelEntry, Resources, RevisionSpec
from deployments.spec import (
    MAX_INSTANCE_COUNT,
    MAX_QUEUE_DELAY_MICROSECONDS,
    DynamicBatching,
    InstanceGroup,
    defaults_for,
)
from infra.names import NAME_RULE, name_error
from modelport.core import quantity
from modelport.core.example_request import ExampleRequestError, example_to_store
from modelport.core.signature import Signature, SignatureError, parse_signature
from models_registry.models import Format, ModelVersion
from web.placement import PoolChoice
from web.serving import serving

# The slider covers the useful range; the number box beside it takes anything up to the API's limit.
QUEUE_DELAY_SLIDER_MAX = 100_000
MAX_PREFERRED_BATCH_SIZES = 32  # as the API's serializer
EXAMPLE_REQUEST_HELP = (
    'Optional: a request the model answers, as KServe v2 JSON: {"inputs": [{"name", "datatype", "shape", "data"}]}, '
    'BYTES elements as text or {"b64": "<base64>"} (an image). A python model\'s trial call at upload sends it '
    "instead of zeros (a model that decodes images cannot be judged on empty bytes); Try it starts from it.")


class UploadForm(forms.Form):
    """The upload page without JavaScript (small files in one request); the page's script uses tus instead."""

    name = forms.CharField(label="Model name", strip=False, help_text=f"A new name creates the model; {NAME_RULE}.",
                           widget=forms.TextInput(attrs={"autocomplete": "off", "list": "model-names",
                                                         "spellcheck": "false"}))
    format = forms.ChoiceField(label="Format", required=False,
                               choices=[("", "Detect from the file")]
                               + [(f.value, f.label) for f in Format if f != Format.ENSEMBLE])
    max_batch_size = forms.IntegerField(label="Max batch size", required=False, min_value=0, max_value=1_000_000,
                                        help_text="The largest batch Triton may hand the model at once; 0 turns "
                                                  "batching off. Empty: fitted to what inspection finds in the file.")
    signature = forms.CharField(label="Signature (JSON)", required=False, widget=forms.Textarea(attrs={"rows": 4}),
                                help_text='Needed for formats that carry none: {"inputs": [{"name", "datatype", '
                                          '"dims"}], "outputs": [...]}')
    file = forms.FileField(label="Model file")
    example_request = forms.CharField(
        label="Example request (JSON)", required=False,
        widget=forms.Textarea(attrs={"rows": 4, "spellcheck": "false", "autocomplete": "off"}),
        help_text=EXAMPLE_REQUEST_HELP)
    decoupled = forms.BooleanField(
        label="Streams its answer (decoupled)", required=False,
        help_text="A python model that sends its answer in pieces (Triton's decoupled mode): served by "
                  "/generate_stream and gRPC's stream, not /infer. Python models only.")

    def rollout(self) -> canary.Rollout | None:
        return rollout_from(self.cleaned_data)

    def clean_name(self) -> str:
        name: str = self.cleaned_data["name"]
        error = name_error(name)
        if error:
            raise forms.ValidationError(error)
        return name

    def clean_signature(self) -> Signature | None:
        raw = self.cleaned_data["signature"].strip()
        if not raw:
            return None
        try:
            return parse_signature(raw)
        except SignatureError as exc:
            raise forms.ValidationError(str(exc)) from None

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        # Against the declared signature, as the API checks it (the same function, the same messages); after
        # clean_signature, so that a broken signature is said once, beside its own field.
        raw = (data.get("example_request") or "").strip()
        data["example_request"] = None
        if raw and "signature" not in self.errors:
            try:
                data["example_request"] = example_to_store(raw, data.get("signature"),
                                                           settings.EXAMPLE_REQUEST_MAX_BYTES)
            except ExampleRequestError as exc:
                self.add_error("example_request", str(exc))
        return data


class TokenForm(forms.Form):
    name = forms.CharField(label="Token name", max_length=100, required=False,
                           help_text="What it is for, e.g. “CI deploy”.")
    expires_in_days = forms.IntegerField(label="Expires after (days)", min_value=1, required=False)
    manage_tokens = forms.BooleanField(
        label="May manage tokens", required=False,
        help_text=f"The “{SCOPE_TOKENS}” scope: the token may list, create and revoke your tokens in this team. "
                  "Leave it off for jobs that only upload and deploy.",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The maximum is a setting (API_TOKEN_MAX_LIFETIME_DAYS): read when the form is made, not at import.
        limit = max_token_lifetime_days()
        default = f"{limit} days" if settings.API_TOKEN_MAX_LIFETIME_DAYS else "never"
        self.fields["expires_in_days"] = forms.IntegerField(
            label="Expires after (days)", min_value=1, max_value=limit, required=False,
            help_text=f"At most {limit}. Empty: {default}.",
        )

    def scopes(self) -> list[str]:
        return [SCOPE_TOKENS] if self.cleaned_data.get("manage_tokens") else []


class SelectWithReasons(forms.Select):
    """A select whose unavailable options stay listed, disabled, with the reason in their label."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.unavailable: dict[str, str] = {}

    def create_option(self, name: str, value: Any, label: Any, selected: Any, index: int,
                      subindex: int | None = None, attrs: dict[str, Any] | None = None) -> dict[str, Any]:
        option: dict[str, Any] = super().create_option(name, value, label, selected, index, subindex, attrs)
        reason = self.unavailable.get(str(value))
        if reason:
            option["label"] = f"{label} ({reason})"
            option["attrs"]["disabled"] = True
        return option


class DeploymentForm(forms.Form):
    name = forms.CharField(label="Deployment name", strip=False, help_text=f"Part of the endpoint URL; {NAME_RULE}.",
                           widget=forms.TextInput(attrs={"autocomplete": "off", "spellcheck": "false"}))
    runtime = forms.ChoiceField(label="Runtime", choices=Deployment.Runtime.choices, widget=SelectWithReasons)
    # Shown for the Kubernetes runtime only (the local runtime runs one server; the page says so in its place).
    replicas = forms.IntegerField(label="Replicas", initial=1, min_value=1, max_value=MAX_REPLICAS,
                                  help_text="Copies of the Triton server, each serving every model of the deployment.")
    gpu = forms.IntegerField(label="GPUs per replica", required=False, initial=0, min_value=0, max_value=MAX_GPUS)
    gpu_type = forms.CharField(label="GPU type", required=False,
                               help_text="A node's GPU product, e.g. NVIDIA-A100; empty: any.")
    # Checked by deployments.planning (modelport.core.quantity), whose messages land beside these fields.
    cpu = forms.CharField(label="CPU per replica", required=False, max_length=quantity.MAX_LENGTH,
                          widget=forms.TextInput(attrs={"autocomplete": "off", "spellcheck": "false"}),
                          help_text='Cores, e.g. "2" or "500m"; empty: the default.')
    memory = forms.CharField(label="Memory per replica", required=False, max_length=quantity.MAX_LENGTH,
                             widget=forms.TextInput(attrs={"autocomplete": "off", "spellcheck": "false"}),
                             help_text='e.g. "4Gi" or "512Mi"; empty: on the local runtime, derived from what '
                                       "its models were measured to take (shown on the deployment's page), else "
                                       "the default.")

    # Where its models run (issue 24): checked by deployments.planning like the API's placement.
    placement = forms.ChoiceField(
        label="Where it runs", widget=forms.RadioSelect, required=False,  # not given: the operator's default
        choices=[("dedicated", "Dedicated: a Triton server of its own, always loaded"),
                 ("shared", "Shared: loads on demand, costs less")],
        help_text=("Shared: its models are loaded into a pool's Triton beside other deployments' models when "
                   "requests come, and unloaded when unused; the first request after that waits for the load (the "
                   "cold start). A pool open to every team takes ONNX models only."))
    pool = forms.ChoiceField(label="Pool", required=False, widget=SelectWithReasons,
                             help_text="What fits comes from what the model took when it last loaded here.")
    idle_unload_seconds = forms.IntegerField(
        label="Unload after unused for (seconds)", required=False, min_value=0, max_value=MAX_IDLE_UNLOAD_SECONDS,
        help_text="Empty: the pool's default. 0: never unloaded while the deployment runs.")

    # Offered by the edit form only (a canary runs beside a serving revision): empty rolls out atomically.
    canary_percent = forms.IntegerField(
        label="Roll out as canary: N%", required=False, min_value=1, max_value=99,
        help_text=("Empty: the new settings take every request once ready. A number: they serve that share of the "
                   "requests beside the current ones until you promote or roll back, or the guardrails below roll "
                   "them back."))
    # The canary's guardrails (deployments/canary.py), with the API's bounds and defaults (docs/api.md).
    canary_max_error_percent = forms.FloatField(
        label="Roll back past this error rate (%)", required=False, min_value=0, max_value=100,
        initial=canary.DEFAULT_MAX_ERROR_RATE * 100,
        help_text="The canary's share of 5xx and 429 answers over the window.")
    canary_max_p99_ratio = forms.FloatField(
        label="Roll back past this p99 ratio", required=False, min_value=1, max_value=1000,
        initial=canary.DEFAULT_MAX_P99_RATIO,
        help_text=(f"The canary's p99 latency over the current revision's (and {canary.P99_SLACK_MS:g} ms more), "
                   f"judged only on a whole window and once each revision has at least "
                   f"{canary.MIN_REQUESTS_FOR_P99} requests in it (or the minimum below, if larger): before that "
                   "a promotion does not look at latency."))
    canary_window_seconds = forms.IntegerField(
        label="Window (seconds)", required=False, min_value=canary.MIN_WINDOW_SECONDS,
        max_value=canary.MAX_WINDOW_SECONDS, initial=canary.DEFAULT_WINDOW_SECONDS,
        help_text="Both revisions are compared over this many seconds since the canary serves.")
    canary_min_requests = forms.IntegerField(
        label="Minimum requests", required=False, min_value=1, max_value=1_000_000,
        initial=canary.DEFAULT_MIN_REQUESTS,
        help_text=(f"No verdict on fewer canary requests in the window; the p99 ratio needs at least "
                   f"{canary.MIN_REQUESTS_FOR_P99} of each revision."))
    canary_auto_promote = forms.BooleanField(
        label="Promote it automatically after a whole window within the guardrails", required=False)

    CANARY_FIELDS = ("canary_percent", "canary_max_error_percent", "canary_max_p99_ratio", "canary_window_seconds",
                     "canary_min_requests", "canary_auto_promote")

    def __init__(self, *args: Any, editing: bool = False, pools: list[PoolChoice] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not editing:
            for field in self.CANARY_FIELDS:
                del self.fields[field]
        self.pools = pools or []
        pool = self.fields["pool"]
        assert isinstance(pool, forms.ChoiceField) and isinstance(pool.widget, SelectWithReasons)
        pool.choices = [(c.pool.name, c.label) for c in self.pools]
        pool.widget.unavailable = {c.pool.name: c.unavailable for c in self.pools if c.unavailable}
        self.serving = serving()
        runtime = self.fields["runtime"]
        runtime.help_text = self.serving.note()
        if not self.serving.kubernetes_ready and not editing:
            # Not offered where it cannot start: a deployment on it would only fail with this same reason.
            assert isinstance(runtime.widget, SelectWithReasons)
            runtime.widget.unavailable = {Deployment.Runtime.KUBERNETES: "not configured here"}
            runtime.help_text += f" The Kubernetes runtime is not available: {self.serving.kubernetes_problem}"
        if editing:
            # The API refuses to change these: a deployment keeps its name (its URL) and runtime.
            self.fields["name"].disabled = True
            self.fields["runtime"].disabled = True
            self.fields["name"].help_text = "The name cannot change (it is in the endpoint URL)."
            self.fields["runtime"].help_text = "The runtime cannot change: create a new deployment instead."

    def rollout(self) -> canary.Rollout | None:
        return rollout_from(self.cleaned_data)

    def clean_name(self) -> str:
        name: str = self.cleaned_data["name"]
        error = name_error(name)
        if error and not self.fields["name"].disabled:
            raise forms.ValidationError(error)
        return name


# Values past which the deploy form warns beside the field (static/js/app.js), before anything is deployed.
WARN_QUEUE_DELAY_MICROSECONDS = 100_000
WARN_MAX_BATCH_SIZE = 1024


class ServedModelForm(forms.Form):
    """The serving settings of one model of a deployment (prefix "m0", "m1", ...)."""

    version = forms.TypedChoiceField(label="Version", coerce=int)
    max_batch_size = forms.IntegerField(
        label="Max batch size", min_value=0, max_value=1_000_000,
        widget=forms.NumberInput(attrs={
            "min": 0, "data-warn-above": WARN_MAX_BATCH_SIZE,
            "data-warning": "A batch this large must fit in memory at once, inputs and outputs; models are rarely "
                            "served with batches past a few hundred."}),
        help_text="The largest batch Triton may hand the model at once: requests are stacked along the first "
                  "dimension up to this size. 0 turns batching off.")
    dynamic_batching = forms.BooleanField(label="Dynamic batching", required=False,
                                          widget=forms.CheckboxInput(attrs={"role": "switch"}))
    max_queue_delay_microseconds = forms.IntegerField(
        label="Max queue delay (µs)", required=False, initial=0, min_value=0, max_value=MAX_QUEUE_DELAY_MICROSECONDS,
        widget=forms.NumberInput(attrs={
            "min": 0, "max": MAX_QUEUE_DELAY_MICROSECONDS, "step": 1, "data-warn-above": WARN_QUEUE_DELAY_MICROSECONDS,
            "data-warning": "A request that arrives alone waits this long before it runs: every request of a quiet "
                            "deployment does."}),
        help_text="A longer delay lets Triton gather more requests into one batch: more throughput, "
                  "but a request may wait up to this long before it runs.")
    preferred_batch_size = forms.CharField(label="Preferred batch sizes", required=False,
                                           help_text="Comma-separated, e.g. 4, 8 (each at most the max batch size).",
                                           widget=forms.TextInput(attrs={"inputmode": "numeric",
                                                                         "autocomplete": "off"}))
    instance_count = forms.IntegerField(label="Instances", initial=1, min_value=1, max_value=MAX_INSTANCE_COUNT,
                                        widget=forms.NumberInput(attrs={"min": 1, "max": MAX_INSTANCE_COUNT}),
                                        help_text="Copies of the model inside each server, run in parallel.")
    # The page's script disables GPU while the form's runtime is the local one (which has none): the option used to
    # be offered there, and answered "the local runtime has no GPU" only once sent.
    instance_kind = forms.ChoiceField(label="Instance kind", choices=[("cpu", "CPU"), ("gpu", "GPU")],
                                      widget=forms.Select(attrs={"data-gpu-option": "kubernetes"}))

    def __init__(self, *args: Any, model_name: str, versions: list[ModelVersion], current: ModelEntry | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.model_name = model_name
        self.versions = {v.number: v for v in versions}
        # The entry being edited: the settings this form does not show are carried over from it.
        self.current = current
        version_field = self.fields["version"]
        assert isinstance(version_field, forms.TypedChoiceField)
        version_field.choices = [(v.number, f"{v.number} ({v.get_format_display()})") for v in versions]
        initial_version = self.versions.get(_int_or_none(self.initial.get("version")) or -1)
        self.is_pipeline = initial_version is not None and initial_version.format == Format.ENSEMBLE
        if self.is_pipeline:
            # Triton batches and runs a pipeline in its steps, each with its own settings: these would not apply.
            for name in ("dynamic_batching", "max_queue_delay_microseconds", "preferred_batch_size", "instance_count",
                         "instance_kind"):
                self.fields[name].disabled = True

    @property
    def slider_max(self) -> int:
        return QUEUE_DELAY_SLIDER_MAX

    def clean_preferred_batch_size(self) -> list[int]:
        raw = self.cleaned_data["preferred_batch_size"].strip()
        if not raw:
            return []
        parts = [p for p in re.split(r"[\s,]+", raw) if p]
        if not all(p.isdigit() for p in parts):
            raise forms.ValidationError("Enter whole numbers separated by commas, e.g. 4, 8.")
        if len(parts) > MAX_PREFERRED_BATCH_SIZES:
            raise forms.ValidationError(f"Give at most {MAX_PREFERRED_BATCH_SIZES} sizes.")
        return [int(p) for p in parts]

    def asked_entry(self) -> ModelEntry:
        """This model's part of the deploy request."""
        data = self.cleaned_data
        current = self.current
        batching = None
        if data["dynamic_batching"]:
            kept_batching = current.dynamic_batching if current is not None else None
            batching = DynamicBatching(max_queue_delay_microseconds=data["max_queue_delay_microseconds"] or 0,
                                       preferred_batch_size=tuple(data["preferred_batch_size"]),
                                       preserve_ordering=kept_batching is not None and kept_batching.preserve_ordering)
        # GPU ids are kept with the kind they were chosen for; a pipeline's instances were never applied.
        kept_group = current.instance_group if current is not None and not current.is_pipeline else InstanceGroup()
        gpus = kept_group.gpus if data["instance_kind"] == "gpu" else ()
        max_batch_size = data["max_batch_size"]
        version = self.versions.get(data["version"])
        if version is not None and version.format == Format.ENSEMBLE and "max_batch_size" not in self.changed_data:
            max_batch_size = None  # left to the planner, which fits a pipeline's batches to its steps
        return ModelEntry.asked(
            self.model_name, version=data["version"], max_batch_size=max_batch_size, dynamic_batching=batching,
            instance_group=InstanceGroup(count=data["instance_count"], kind=data["instance_kind"], gpus=gpus),
            response_cache=current is not None and current.response_cache,
            warmup=current.warmup if current is not None else None,
        )


def _int_or_none(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def initial_for_version(version: ModelVersion) -> dict[str, Any]:
    """The deploy form's starting values for a model version: deployments.spec.defaults_for()."""
    defaults = defaults_for(version.parsed_signature, version.max_batch_size)
    # A pipeline batches through its steps; Triton gives an ensemble no dynamic batching of its own.
    batching = defaults.dynamic_batching if version.format != Format.ENSEMBLE else None
    return {
        "version": version.number,
        "max_batch_size": defaults.max_batch_size,
        "dynamic_batching": batching is not None,
        "max_queue_delay_microseconds": batching.max_queue_delay_microseconds if batching else 0,
        "preferred_batch_size": ", ".join(str(s) for s in batching.preferred_batch_size) if batching else "",
        "instance_count": defaults.instance_group.count,
        "instance_kind": defaults.instance_group.kind,
    }


def initial_for_entry(entry: ModelEntry) -> dict[str, Any]:
    """The form's initial values for a model entry of a revision's spec (ServedModelForm's `current` keeps the
    settings it does not show)."""
    batching = entry.dynamic_batching
    # A pipeline's instances were never applied, and are refused now: saving again writes the defaults.
    group = entry.instance_group if not entry.is_pipeline else InstanceGroup()
    initial = {
        "version": entry.version,
        "max_batch_size": entry.max_batch_size,
        "dynamic_batching": batching is not None,
        "max_queue_delay_microseconds": batching.max_queue_delay_microseconds if batching else 0,
        "preferred_batch_size": ", ".join(str(s) for s in batching.preferred_batch_size) if batching else "",
        "instance_count": group.count,
        "instance_kind": group.kind,
    }
    return initial


def deploy_request(form: DeploymentForm, model_forms: list[ServedModelForm],
                   current: RevisionSpec | None = None) -> planning.DeployRequest:
    """The deploy request of valid forms; settings the form does not show (a MIG profile, autoscaling) are kept from
    the `current` revision when editing."""
    data = form.cleaned_data
    kept = current.resources if current else Resources()
    kubernetes = data["runtime"] == Deployment.Runtime.KUBERNETES
    resources = Resources(
        cpu=data.get("cpu") or "", memory=data.get("memory") or "", mig_profile=kept.mig_profile,
        # The GPU fields are hidden for the local runtime: whatever they hold then does not count.
        gpu=(data.get("gpu") or 0) if kubernetes else 0, gpu_type=(data.get("gpu_type") or "") if kubernetes else "",
    )
    shared = data.get("placement") == "shared"
    # The pool fields are hidden for a dedicated deployment: whatever they hold then does not count.
    placement = planning.PlacementRequest(
        mode=data.get("placement") or None, pool=(data.get("pool") or None) if shared else None,
        idle_unload_seconds=data.get("idle_unload_seconds") if shared else None)
    return planning.DeployRequest(
        runtime=data["runtime"], replicas=data["replicas"], resources=resources,
        autoscaling=current.autoscaling if current else None,
        models=tuple(f.asked_entry() for f in model_forms), placement=placement,
    )


def placement_initial(spec: RevisionSpec | None) -> dict[str, Any]:
    """The deploy form's placement fields: the revision's when editing, else the operator's default mode."""
    if spec is None:
        return {"placement": settings.DEPLOYMENT_DEFAULT_PLACEMENT}
    placement = spec.placement
    if not placement.shared:
        return {"placement": "dedicated"}
    return {"placement": "shared", "pool": placement.pool, "idle_unload_seconds": placement.idle_unload_seconds}


_MODEL_KEY = re.compile(r"^models\[(\d+)\]\.?(.*)$")
_MODEL_FIELDS = {
    "version": "version",
    "max_batch_size": "max_batch_size",
    "dynamic_batching": "dynamic_batching",
    "dynamic_batching.max_queue_delay_microseconds": "max_queue_delay_microseconds",
    "dynamic_batching.preferred_batch_size": "preferred_batch_size",
    "instance_group.count": "instance_count",
    "instance_group.kind": "instance_kind",
    "instance_group.gpus": "instance_kind",
}
_DEPLOYMENT_FIELDS = {"name": "name", "runtime": "runtime", "replicas": "replicas", "resources.gpu": "gpu",
                      "resources.gpu_type": "gpu_type", "resources.cpu": "cpu", "resources.memory": "memory",
                      "placement": "placement", "placement.mode": "placement", "placement.pool": "pool",
                      "placement.idle_unload_seconds": "idle_unload_seconds"}


def add_plan_errors(errors: dict[str, list[str]], form: DeploymentForm, model_forms: list[ServedModelForm]) -> None:
    """Put the planner's errors ("models[0].dynamic_batching.preferred_batch_size": [...]) beside their fields;
    what has no field of its own goes to the top of its model's settings, or of the form."""
    for key, messages in errors.items():
        key = re.sub(r"\[\d+\]$", "", key)  # a list item's error ("...preferred_batch_size[1]") goes to the list
        match = _MODEL_KEY.match(key)
        if match and int(match.group(1)) < len(model_forms):
            model_form = model_forms[int(match.group(1))]
            field = _MODEL_FIELDS.get(match.group(2))
            if field and model_form.fields[field].disabled:
                field = None  # not shown (a pipeline's batching and instances): at the top of its settings
            for message in messages:
                model_form.add_error(field, message)
            continue
        field = _DEPLOYMENT_FIELDS.get(key)
        if field and form.fields[field].disabled:
            field = None
        for message in messages:
            form.add_error(field, message if field or key == "non_field_errors" else f"{key}: {message}")


def rollout_from(data: dict[str, Any]) -> canary.Rollout | None:
    """The canary a form asked for (a percent), with its guardrails; an empty guardrail takes its default. None: an
    atomic rollout."""
    percent = data.get("canary_percent")
    if not percent:
        return None

    def given(name: str, default: Any) -> Any:
        value = data.get(name)
        return default if value is None else value

    return canary.Rollout(
        percent=percent,
        max_error_rate=given("canary_max_error_percent", canary.DEFAULT_MAX_ERROR_RATE * 100) / 100,
        max_p99_ratio=given("canary_max_p99_ratio", canary.DEFAULT_MAX_P99_RATIO),
        window_seconds=given("canary_window_seconds", canary.DEFAULT_WINDOW_SECONDS),
        min_requests=given("canary_min_requests", canary.DEFAULT_MIN_REQUESTS),
        auto_promote=bool(data.get("canary_auto_promote")))


class ImportForm(forms.Form):
    """The upload page's "From a registry" tab: a source the portal fetches itself (the API's `source`), one kind at
    a time; clean() makes it the API's JSON, which the fetcher of its kind then checks as for the API."""

    KINDS = [("mlflow", "MLflow registry"), ("huggingface", "Hugging Face"), ("uri", "S3 or HTTPS URI")]

    name = forms.CharField(label="Model name", strip=False, help_text=f"A new name creates the model; {NAME_RULE}.",
                           widget=forms.TextInput(attrs={"autocomplete": "off", "list": "model-names",
                                                         "spellcheck": "false"}))
    kind = forms.ChoiceField(label="Source", choices=KINDS, initial="mlflow", widget=forms.RadioSelect)
    mlflow_uri = forms.CharField(label="Registered model URI", required=False,
                                 help_text="models:/NAME/VERSION or models:/NAME@ALIAS",
                                 widget=forms.TextInput(attrs={"placeholder": "models:/fraud/3",
                                                               "spellcheck": "false"}))
    hf_repo = forms.CharField(label="Repository", required=False, help_text="ORG/NAME",
                              widget=forms.TextInput(attrs={"placeholder": "org/name", "spellcheck": "false"}))
    hf_revision = forms.CharField(label="Revision", required=False, initial="main",
                                  help_text="A branch, tag or commit (main if empty).")
    hf_files = forms.CharField(label="Files", required=False,
                               help_text="The repository's files to import, one a line or comma-separated "
                                         "(empty: the portal picks).",
                               widget=forms.Textarea(attrs={"rows": 2, "spellcheck": "false"}))
    uri = forms.CharField(label="URI", required=False, help_text="s3://BUCKET/KEY or https://HOST/PATH",
                          widget=forms.TextInput(attrs={"placeholder": "s3://bucket/key", "spellcheck": "false"}))

    def clean_name(self) -> str:
        name: str = self.cleaned_data["name"]
        error = name_error(name)
        if error:
            raise forms.ValidationError(error)
        return name

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        kind = data.get("kind")
        required = {"mlflow": "mlflow_uri", "huggingface": "hf_repo", "uri": "uri"}.get(str(kind))
        if required and not str(data.get(required) or "").strip():
            self.add_error(required, "Required for this source.")
            return data
        if kind == "mlflow":
            data["source"] = {"kind": "mlflow", "uri": data["mlflow_uri"].strip()}
        elif kind == "huggingface":
            source: dict[str, Any] = {"kind": "huggingface", "repo": data["hf_repo"].strip(),
                                      "revision": data.get("hf_revision", "").strip() or "main"}
            files = [f.strip() for f in re.split(r"[,\n]", data.get("hf_files") or "") if f.strip()]
            if files:
                source["files"] = files
            data["source"] = source
        elif kind == "uri":
            data["source"] = {"kind": "uri", "uri": data["uri"].strip()}
        return data
