"""Typed PDDeployment spec, parsed once at the handler boundary; the rest of the code never reads raw dicts.

Field names are snake_case in Python and camelCase on the wire (aliases). Defaults mirror the CRD's, so an
object that skipped API-server defaulting (a unit test, a dry run) parses to the same values. Cross-field
rules repeat the CRD's CEL rules: a clear error here beats a confusing failure later.
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from xpyd_api.engines import (
    NIXL_CONNECTOR,
    NIXL_DEFAULT_KV_LEASE_S,
    ROLE_SWITCH,
    SGLANG_DEFAULT_TRANSFER_BACKEND,
    SGLANG_ROLE_SWITCH_BACKENDS,
    VERSION_PATTERN,
    VLLM_KV_BOTH_READ_THROUGH_TEXT,
    EngineType,
    KvBoth,
    image_tag_version,
    parallelism_beyond_one,
    vllm_kv_both,
)
from xpyd_api.errors import InputError
from xpyd_api.names import Role

# vLLM kv_connector -> vllm-router's `--kv-connector` (the connectors the router's PD mode speaks).
VLLM_ROUTER_KV_CONNECTORS = {
    NIXL_CONNECTOR: "nixl",
    "MooncakeConnector": "mooncake",
    "MoRIIOConnector": "moriio",
}


class PDDSpecError(InputError):
    """A PDDeployment spec that cannot be reconciled: its first problem's field, value and rule, and a
    message naming every problem."""


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True, extra="ignore")


class RouterType(StrEnum):
    VLLM_ROUTER = "vllm-router"
    SGLANG_ROUTER = "sglang-router"
    SMG = "smg"  # the SGLang model gateway, sglang-router's successor (PyPI smg)
    NONE = "none"


class SwitchMethod(StrEnum):
    AUTO = "Auto"
    ROUTING = "Routing"
    HTTP = "HTTP"
    RESTART = "Restart"
    IN_PLACE = "InPlace"  # relabel, and the kubelet restarts the engine container in the new role


# The most instances of one role (and the most surge or unavailability) a PDDeployment may ask for: far
# above any real pool, low enough that one object cannot make the operator plan a billion pods.
MAX_REPLICAS = 512
MAX_ROUTER_REPLICAS = 64


class AutoscalingMode(StrEnum):
    OFF = "Off"
    ADVISORY = "Advisory"
    AUTO = "Auto"


class ModelSpec(_Model):
    """The served model and, optionally, its architecture numbers for the capacity model."""

    name: str = Field(min_length=1)
    preset: str | None = None
    params: float | None = Field(default=None, ge=1e6)
    layers: int | None = Field(default=None, ge=1)
    kv_heads: int | None = Field(default=None, ge=1)
    head_dim: int | None = Field(default=None, ge=1)
    hidden_size: int | None = Field(default=None, ge=1)
    kv_bytes: float | None = Field(default=None, ge=0.125)
    weight_bytes: float | None = Field(default=None, ge=0.125)
    kv_latent_dim: int | None = Field(default=None, ge=1)
    rope_dim: int | None = Field(default=None, ge=1)


class HardwareSpec(_Model):
    """GPU and link numbers for the capacity model (presets resolved by the controller)."""

    gpu: str | None = None
    peak_flops: float | None = Field(default=None, ge=1e9)
    mfu: float | None = Field(default=None, ge=0.001, le=1)
    hbm_bandwidth: float | None = Field(default=None, ge=1e9)
    mbu: float | None = Field(default=None, ge=0.001, le=1)
    hbm_bytes: float | None = Field(default=None, ge=1e9)
    link: str | None = None
    link_bandwidth: float | None = Field(default=None, ge=1e6)
    link_overhead_seconds: float | None = Field(default=None, ge=0)


class SloSpec(_Model):
    ttft_seconds: float = Field(default=0.6, ge=0.001)
    tpot_seconds: float = Field(default=0.1, ge=0.001)
    attainment: float = Field(default=0.9, ge=0.5, le=1)
    transfer_budget_seconds: float | None = Field(default=None, ge=0.001)


class EnvVar(_Model):
    """An environment variable with a literal value (never a reference: see SecretEnvVar)."""

    name: str = Field(min_length=1)
    value: str = ""


class SecretEnvVar(_Model):
    """An environment variable read from one key of a Secret in the PDDeployment's namespace."""

    name: str = Field(min_length=1)
    secret_name: str = Field(min_length=1)
    key: str = Field(min_length=1)


class Capability(StrEnum):
    IPC_LOCK = "IPC_LOCK"
    SYS_RESOURCE = "SYS_RESOURCE"


class SecuritySpec(_Model):
    """Overrides of the restricted security context every pod gets (see render.security_context)."""

    run_as_non_root: bool = True
    run_as_user: int | None = Field(default=None, ge=0, le=2**31 - 1)
    run_as_group: int | None = Field(default=None, ge=0, le=2**31 - 1)
    fs_group: int | None = Field(default=None, ge=0, le=2**31 - 1)
    add_capabilities: tuple[Capability, ...] = ()


class EngineSpec(_Model):
    type: EngineType = EngineType.VLLM
    image: str = Field(min_length=1)
    # the engine's release (vLLM: decides whether kv_both is taken); unset: read from the image's tag
    version: str | None = Field(default=None, pattern=VERSION_PATTERN)
    command: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    port: int = Field(default=8000, ge=1, le=65535)
    kv_connector: str | None = None
    env: tuple[EnvVar, ...] = ()
    secret_env: tuple[SecretEnvVar, ...] = ()
    security: SecuritySpec = SecuritySpec()


class ResourcesSpec(_Model):
    """Container resources besides GPUs (quantities as strings or integers, like core/v1)."""

    limits: dict[str, str | int] = Field(default_factory=dict)
    requests: dict[str, str | int] = Field(default_factory=dict)


class PoolSpec(_Model):
    """One role's pool: how many instances and the parts of their pod template."""

    replicas: int = Field(default=1, ge=0, le=MAX_REPLICAS)
    min_replicas: int = Field(default=0, ge=0, le=MAX_REPLICAS)
    max_replicas: int = Field(default=64, ge=0, le=MAX_REPLICAS)
    gpus_per_instance: int = Field(default=1, ge=1, le=64)
    args: tuple[str, ...] = ()
    resources: ResourcesSpec = ResourcesSpec()
    env: tuple[EnvVar, ...] = ()
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: tuple[dict[str, Any], ...] = ()
    affinity: dict[str, Any] | None = None  # this role only; replaces spec.affinity

    def scheduling_key(self) -> tuple[Any, ...]:
        """What decides where an instance can run (besides affinity); equal keys make two roles convertible.
        Tolerations count as a set, as the CRD's rule compares them (order and repeats place nothing)."""
        tolerations = frozenset(json.dumps(t, sort_keys=True) for t in self.tolerations)
        return (self.gpus_per_instance, self.resources, self.node_selector, tolerations)


class RouterSpec(_Model):
    type: RouterType = RouterType.VLLM_ROUTER
    image: str | None = Field(default=None, min_length=1)
    replicas: int = Field(default=1, ge=0, le=MAX_ROUTER_REPLICAS)
    port: int = Field(default=8000, ge=1, le=65535)
    args: tuple[str, ...] = ()
    security: SecuritySpec = SecuritySpec()
    service_account_name: str | None = None


class ConversionSpec(_Model):
    enabled: bool = True
    drain_timeout_seconds: float = Field(default=60.0, ge=1)
    # How long a vLLM prefill instance keeps a finished request's KV for decode to pull (rendered as
    # NIXL's kv_connector_extra_config.kv_lease_duration; vLLM's own default by default): a prefill
    # instance switches or goes only this long after its last request ended (within drainTimeoutSeconds).
    kv_lease_seconds: float = Field(default=NIXL_DEFAULT_KV_LEASE_S, ge=1, le=3600)
    switch_method: SwitchMethod = SwitchMethod.AUTO
    switch_path: str = Field(default=ROLE_SWITCH.path, pattern=r"^(/[A-Za-z0-9._~-]+)+$")  # a plain path


class RolloutSpec(_Model):
    max_surge: int = Field(default=1, ge=0, le=MAX_REPLICAS)
    max_unavailable: int = Field(default=0, ge=0, le=MAX_REPLICAS)


class PrometheusRef(_Model):
    url: str
    bearer_token_secret_ref: dict[str, str] | None = None


class AutoscalingSpec(_Model):
    mode: AutoscalingMode = AutoscalingMode.OFF
    interval_seconds: float = Field(default=15.0, ge=1)
    prometheus: PrometheusRef | None = None
    scale_up_window_seconds: float = Field(default=0.0, ge=0)
    scale_down_window_seconds: float = Field(default=300.0, ge=0)
    scale_down_period_seconds: float = Field(default=60.0, ge=1, le=1800)
    tolerance: float = Field(default=0.1, ge=0, le=0.99)
    gpu_budget: int | None = Field(default=None, ge=0)


class PDDeploymentSpec(_Model):
    """`spec` of a PDDeployment."""

    model: ModelSpec
    hardware: HardwareSpec = HardwareSpec()
    slo: SloSpec = SloSpec()
    engine: EngineSpec
    prefill: PoolSpec = PoolSpec()
    decode: PoolSpec = PoolSpec()
    affinity: dict[str, Any] | None = None  # both roles
    router: RouterSpec = RouterSpec()
    conversion: ConversionSpec = ConversionSpec()
    rollout: RolloutSpec = RolloutSpec()
    autoscaling: AutoscalingSpec = AutoscalingSpec()

    @model_validator(mode="after")
    def _cross_field_rules(self) -> PDDeploymentSpec:
        for role in Role:
            pool = self.pool(role)
            if not pool.min_replicas <= pool.replicas <= pool.max_replicas:
                raise ValueError(
                    f"spec.{role}.replicas={pool.replicas} must be within "
                    f"[minReplicas={pool.min_replicas}, maxReplicas={pool.max_replicas}]"
                )
        if self.conversion.enabled and not self.roles_compatible:
            raise ValueError(
                "spec.conversion.enabled=true requires spec.prefill and spec.decode to have equal "
                "gpusPerInstance, resources, nodeSelector and tolerations, and no per-role affinity"
            )
        if (
            self.router.type is RouterType.VLLM_ROUTER
            and self.engine.type is EngineType.VLLM
            and self.vllm_connector not in VLLM_ROUTER_KV_CONNECTORS
        ):
            raise ValueError(
                f"spec.engine.kvConnector={self.vllm_connector!r}: vllm-router speaks only "
                f"{', '.join(VLLM_ROUTER_KV_CONNECTORS)}"
            )
        if self.router.type is not RouterType.NONE and not self.router.image:
            raise ValueError(f"spec.router.image is required for spec.router.type={self.router.type}")
        if self.rollout.max_surge == 0 and self.rollout.max_unavailable == 0:
            raise ValueError("spec.rollout.maxSurge and spec.rollout.maxUnavailable cannot both be 0")
        return self

    @model_validator(mode="after")
    def _routing_rules(self) -> PDDeploymentSpec:
        """An explicit Routing switch renders kv_both: only vLLM with NixlConnector serves both roles that
        way, and only a version read to take kv_both (the API server checks spec.engine.version by CEL;
        a version read from the image's tag is checked here only)."""
        if self.conversion.switch_method is not SwitchMethod.ROUTING:
            return self
        if not self.serves_both_roles:
            raise ValueError(
                "spec.conversion.switchMethod=Routing needs engine vllm with kvConnector NixlConnector "
                f"(whose kv_role is a placeholder), not engine {self.engine.type} with kvConnector "
                f"{self.engine.kv_connector or 'default'}; use InPlace or Restart"
            )
        if self.kv_both is KvBoth.EXPLICIT:
            field, value = self.version_source
            raise ValueError(
                f"{field}={value!r}: spec.conversion.switchMethod=Routing renders kv_role kv_both, which vLLM "
                f"is read to take only up to {VLLM_KV_BOTH_READ_THROUGH_TEXT}; use InPlace (or Auto)"
            )
        return self

    @model_validator(mode="after")
    def _sglang_switch_rules(self) -> PDDeploymentSpec:
        """What SGLang's HTTP role switch cannot switch. The API server refuses the transfer backend
        (CEL); the parallelism in the arguments is checked here, as a CEL rule scanning both argument
        lists is over the API server's cost budget."""
        if not (
            self.conversion.enabled
            and self.engine.type is EngineType.SGLANG
            and self.switch_method is SwitchMethod.HTTP
        ):
            return self
        backend = self.engine.kv_connector or SGLANG_DEFAULT_TRANSFER_BACKEND
        if backend not in SGLANG_ROLE_SWITCH_BACKENDS:
            raise ValueError(
                f"spec.engine.kvConnector={backend!r}: SGLang switches roles over HTTP (/pd_role_switch) only "
                f"with the {' or '.join(SGLANG_ROLE_SWITCH_BACKENDS)} transfer backend; use switchMethod Restart"
            )
        for role in Role:
            found = parallelism_beyond_one((*self.engine.args, *self.pool(role).args))
            if found:
                raise ValueError(
                    f"spec.{role}.args ({found!r}, with spec.engine.args): SGLang switches roles over HTTP "
                    "(/pd_role_switch) only with data, expert and pipeline parallelism of 1 and no DP "
                    "attention; use switchMethod Restart"
                )
        return self

    def pool(self, role: Role) -> PoolSpec:
        return self.prefill if role is Role.PREFILL else self.decode

    @property
    def roles_compatible(self) -> bool:
        """True when an instance of one role could run as the other without moving (same scheduling)."""
        same = self.prefill.scheduling_key() == self.decode.scheduling_key()
        return same and self.prefill.affinity is None and self.decode.affinity is None

    @property
    def vllm_connector(self) -> str:
        """The vLLM kv_connector the instances run (NixlConnector unless spec.engine.kvConnector says)."""
        return self.engine.kv_connector or NIXL_CONNECTOR

    @property
    def serves_both_roles(self) -> bool:
        """True when a relabel alone switches an instance: vLLM's NixlConnector treats kv_role as a
        placeholder (the router decides each request's role); other connectors act on it."""
        return self.engine.type is EngineType.VLLM and self.vllm_connector == NIXL_CONNECTOR

    @property
    def version_source(self) -> tuple[str, str | None]:
        """Where the engine's version is read, and what it says there: spec.engine.version, else the
        image's tag (vLLM images only; None when it names no version)."""
        if self.engine.version:
            return "spec.engine.version", self.engine.version
        return "spec.engine.image", image_tag_version(self.engine.image)

    @property
    def kv_both(self) -> KvBoth:
        """Whether the vLLM version takes kv_role kv_both (UNKNOWN for other engines)."""
        if self.engine.type is not EngineType.VLLM:
            return KvBoth.UNKNOWN
        return vllm_kv_both(self.version_source[1])

    @property
    def decode_sent_after_prefill(self) -> bool:
        """vllm-router in front of vLLM picks a request's decode instance when it arrives but sends it
        only after the prefill answered (measured, 0.1.17), and so does smg (its source: vLLM's PD is
        sequential there): a decode instance out of the router's pool can still receive the requests
        queued at prefill instances."""
        return self.engine.type is EngineType.VLLM and self.router.type in (
            RouterType.VLLM_ROUTER,
            RouterType.SMG,
        )

    @property
    def prefill_holds_kv(self) -> bool:
        """vLLM prefill instances keep a finished request's KV for decode to pull (kv lease)."""
        return self.engine.type is EngineType.VLLM

    @property
    def switch_method(self) -> SwitchMethod:
        """The concrete switch method: Auto resolved from the engine type, and for vLLM from its connector
        and version: Routing (kv_both) only for NixlConnector on a version read to take kv_both, else a
        restart in place with explicit roles."""
        if self.conversion.switch_method is not SwitchMethod.AUTO:
            return self.conversion.switch_method
        if self.engine.type is EngineType.VLLM:
            routing = self.serves_both_roles and self.kv_both is KvBoth.ACCEPTED
            return SwitchMethod.ROUTING if routing else SwitchMethod.IN_PLACE
        return SwitchMethod.HTTP if self.engine.type is EngineType.SGLANG else SwitchMethod.RESTART


class PDDeployment(_Model):
    """The parts of a PDDeployment object the operator needs: identity and spec."""

    name: str
    namespace: str
    uid: str
    generation: int = 0
    spec: PDDeploymentSpec


def parse_pdd(body: dict[str, Any]) -> PDDeployment:
    """Parse a raw PDDeployment object; raise PDDSpecError naming the field, value and rule on bad input."""
    metadata = body.get("metadata", {})
    try:
        return PDDeployment(
            name=metadata.get("name", ""),
            namespace=metadata.get("namespace", ""),
            uid=metadata.get("uid", ""),
            generation=metadata.get("generation", 0),
            spec=PDDeploymentSpec.model_validate(body.get("spec") or {}),
        )
    except ValidationError as error:
        first = error.errors()[0]
        raise PDDSpecError(
            _where(first), first.get("input"), first["msg"], message=_describe(error)
        ) from None


def _where(item: Any) -> str:
    path = ".".join(str(part) for part in item["loc"])
    return f"spec.{path}" if path else "spec"


def _describe(error: ValidationError) -> str:
    problems = []
    for item in error.errors():
        value = item.get("input")
        shown = "" if isinstance(value, dict) else f" (got {value!r})"
        problems.append(f"{_where(item)}: {item['msg']}{shown}")
    return "; ".join(problems)
