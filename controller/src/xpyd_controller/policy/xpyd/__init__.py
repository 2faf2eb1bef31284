"""`xpyd`: the capacity model sized on what is measured, behind the HPA's rails (policy.py says how)."""

from xpyd_controller.policy.context import PolicyContext, configure
from xpyd_controller.policy.xpyd.config import XpydConfig
from xpyd_controller.policy.xpyd.policy import XpydPolicy


def make_xpyd(context: PolicyContext) -> XpydPolicy:
    return XpydPolicy(context, configure("xpyd", XpydConfig(), context.knobs))


__all__ = ["XpydConfig", "XpydPolicy", "make_xpyd"]
