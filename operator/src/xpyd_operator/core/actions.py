"""What the plan asks the I/O shell to do; each action is small enough to be one API call (or one HTTP call)."""

from __future__ import annotations

from dataclasses import dataclass

from xpyd_api.instances import Instance, Transition
from xpyd_api.models import SwitchMethod
from xpyd_api.names import Role


@dataclass(frozen=True)
class CreateInstance:
    role: Role
    name: str
    reason: str


@dataclass(frozen=True)
class DeleteInstance:
    instance: Instance
    reason: str


@dataclass(frozen=True)
class BeginTransition:
    """Stop routing to the instance (serving=false) and record the drain/conversion on it, in one patch."""

    instance: Instance
    transition: Transition
    reason: str


@dataclass(frozen=True)
class AdvanceTransition:
    instance: Instance
    transition: Transition


@dataclass(frozen=True)
class CancelTransition:
    """The pool needs the instance again: put it back in service."""

    instance: Instance


@dataclass(frozen=True)
class SwitchEngine:
    """Change the engine's role; on success the shell records the Verifying step."""

    instance: Instance
    target: Role
    method: SwitchMethod


@dataclass(frozen=True)
class VerifyEngine:
    """Check the switch took effect; on success the shell relabels and resumes serving (FinishConversion)."""

    instance: Instance
    target: Role
    method: SwitchMethod


Action = (
    CreateInstance
    | DeleteInstance
    | BeginTransition
    | AdvanceTransition
    | CancelTransition
    | SwitchEngine
    | VerifyEngine
)
