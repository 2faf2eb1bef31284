"""Kopf entry point: `kopf run -m xpyd_operator.entry.handlers [--namespace NS ... | --all-namespaces]`.

Handlers only wire events to the Reconciler. One daemon per PDDeployment runs level-based reconcile
passes: right away when the object or one of its pods changes, quickly while work is in progress, and
otherwise every resync period. Handler ids are explicit so Kopf's stored progress survives renames.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import kopf

from xpyd_api.k8s import Kube, connect
from xpyd_api.names import (
    COMPONENT_INSTANCE,
    COMPONENT_ROUTER,
    FINALIZER,
    GROUP,
    LABEL_COMPONENT,
    PERSISTENCE_PREFIX,
    PLURAL,
    VERSION,
)
from xpyd_operator.core.config import OperatorConfig
from xpyd_operator.reconcile import Reconciler

TEMPORARY_ERROR_DELAY_SECONDS = 5.0


@kopf.on.startup(id="configure")
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """Own names for Kopf's finalizer and annotations; the reconciler and wake-up events live in memo."""
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=PERSISTENCE_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=PERSISTENCE_PREFIX, key="last-handled-configuration"
    )
    settings.posting.enabled = False  # the reconciler posts its own, meaningful Events
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)  # not one line per handled watch event
    memo.reconciler = Reconciler(Kube(connect()), OperatorConfig.from_env())
    memo.wakeups = {}


def _wake(memo: kopf.Memo, uid: str | None) -> None:
    event = memo.wakeups.get(uid) if uid else None
    if event is not None:
        event.set()


@kopf.daemon(GROUP, VERSION, PLURAL, id="reconcile", cancellation_timeout=1.0)
async def reconcile_loop(
    stopped: kopf.DaemonStopped,
    body: kopf.Body,
    uid: str,
    memo: Any,
    logger: logging.Logger | logging.LoggerAdapter[Any],
    **_: Any,
) -> None:
    """Reconcile one PDDeployment until it is deleted (or the operator stops)."""
    reconciler: Reconciler = memo.reconciler
    config = reconciler.config
    wakeup = memo.wakeups.setdefault(uid, asyncio.Event())
    try:
        while not stopped:
            wakeup.clear()
            try:
                busy = await asyncio.to_thread(reconciler.reconcile_latest, dict(body))
                delay = config.active_poll_seconds if busy else config.resync_seconds
            except Exception:
                logger.exception("reconcile failed; retrying in %.0fs", TEMPORARY_ERROR_DELAY_SECONDS)
                delay = TEMPORARY_ERROR_DELAY_SECONDS
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wakeup.wait(), timeout=delay)
    finally:
        memo.wakeups.pop(uid, None)
        reconciler.forget(uid)


@kopf.on.event(GROUP, VERSION, PLURAL, id="wake-on-change")
async def wake_on_change(uid: str, memo: kopf.Memo, **_: Any) -> None:
    """A spec edit (replicas from the controller, a template change) is handled at once."""
    _wake(memo, uid)


def _wake_owner(body: kopf.Body, memo: Any) -> None:
    for owner in body.metadata.get("ownerReferences") or []:
        if owner.get("kind") == "PDDeployment":
            _wake(memo, owner.get("uid"))


@kopf.on.event("v1", "pods", labels={LABEL_COMPONENT: COMPONENT_INSTANCE}, id="wake-on-pod")
async def wake_on_pod(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """A pod became ready, failed or vanished: reconcile its PDDeployment now, not at the next resync."""
    _wake_owner(body, memo)


@kopf.on.event("apps", "v1", "deployments", labels={LABEL_COMPONENT: COMPONENT_ROUTER}, id="wake-on-router")
async def wake_on_router(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """The router's readiness is part of the Ready condition: report it when it changes."""
    _wake_owner(body, memo)
