"""Names shared by everything that touches a PDDeployment: API coordinates, labels, annotations, conditions.

One place for them, so the operator, the controller, the chart and the tests cannot drift apart.
"""

from __future__ import annotations

from enum import StrEnum

GROUP = "xpyd.dev"
VERSION = "v1alpha1"
KIND = "PDDeployment"
PLURAL = "pddeployments"
API_VERSION = f"{GROUP}/{VERSION}"

# Labels on every instance pod. Services and the router select by them, so a relabel moves an instance.
LABEL_PDD = "xpyd.dev/pdd"
LABEL_ROLE = "xpyd.dev/role"
# vLLM's kv_role for the role (kv_producer, kv_consumer) under switchMethod InPlace: the engine reads it at
# start from the label (downward API), so the relabel that switches the role switches it too.
LABEL_KV_ROLE = "xpyd.dev/kv-role"
LABEL_SERVING = "xpyd.dev/serving"
LABEL_TEMPLATE_HASH = "xpyd.dev/template-hash"
LABEL_COMPONENT = "xpyd.dev/component"
COMPONENT_INSTANCE = "instance"
COMPONENT_ROUTER = "router"

# Annotations on instance pods.
ANNOTATION_TRANSITION = "xpyd.dev/transition"  # JSON record of an in-progress drain/conversion
ANNOTATION_CONVERSIONS = "xpyd.dev/conversions"  # how many conversions this instance completed
ANNOTATION_ENGINE_URL = "xpyd.dev/engine-url"  # overrides http://<podIP>:<port> for the switch endpoint

# Kopf bookkeeping, under our own names so two operators never share (or fight over) them.
FINALIZER = "xpyd.dev/finalizer"
PERSISTENCE_PREFIX = "operator.xpyd.dev"


class Role(StrEnum):
    """The two instance roles of a PD deployment."""

    PREFILL = "prefill"
    DECODE = "decode"

    @property
    def other(self) -> Role:
        """The role an instance of this role converts into."""
        return Role.DECODE if self is Role.PREFILL else Role.PREFILL


class ConditionType(StrEnum):
    """Condition types in `status.conditions`."""

    READY = "Ready"
    PROGRESSING = "Progressing"
    DEGRADED = "Degraded"
    CONVERTING = "Converting"


class Reason(StrEnum):
    """CamelCase reasons used in conditions and Events."""

    ALL_READY = "AllInstancesReady"
    INSTANCES_NOT_READY = "InstancesNotReady"
    ROUTER_NOT_READY = "RouterNotReady"
    SCALING = "Scaling"
    ROLLING_UPDATE = "RollingUpdate"
    STABLE = "Stable"
    PODS_FAILED = "PodsFailed"
    ENGINE_FLAG_UNSUPPORTED = "EngineFlagUnsupported"
    HEALTHY = "Healthy"
    INVALID_SPEC = "InvalidSpec"
    INVALID_RECORD = "InvalidRecord"
    CONVERTING = "ConvertingRoles"
    NO_CONVERSION = "NoConversion"
    CREATED = "Created"
    DELETED = "Deleted"
    DRAINING = "Draining"
    CONVERTED = "Converted"
    CONVERSION_STEP = "ConversionStep"
    SWITCH_FAILED = "SwitchFailed"
    ROUTER_IGNORES_LABELS = "RouterIgnoresLabels"
    OBJECT_REJECTED = "ObjectRejected"  # the API server refused a rendered object (4xx)
    NAMESPACE_EXCLUDED = "NamespaceExcluded"  # the operator serves no PDDeployment in this namespace
    # the controller cannot configure autoscaling from this spec (its Warning; the operator's Degraded)
    INVALID_AUTOSCALING = "InvalidAutoscaling"


# status.autoscaler.binding of a decision the controller could not take: the spec cannot configure a
# policy (no model to size with, a refused Prometheus URL, contradictory bounds); its message says why.
BINDING_INVALID_SETUP = "invalid_setup"
