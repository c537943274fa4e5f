"""Leader election on a coordination.k8s.io Lease, so two operator replicas never both act.

kopf's peering is not leader election (both peers handle events until they notice each other). Before
kopf starts, the operator takes the Lease ``<name>`` in its own namespace and renews it every
``renew_seconds``; a replica that cannot renew within ``lease_seconds`` stops (the kubelet restarts it and
it queues for the Lease again). The decisions are pure (``may_take``, ``taken``); ``LeaderElector``
does the requests, with the Lease's resourceVersion so two replicas can never both win.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timezone
from typing import Any, Callable

from forge_replay.controller.kube import Kube, KubeError

log = logging.getLogger("forge_replay.controller.leader")

LEASE_API = "coordination.k8s.io/v1"


def _now() -> datetime:
    return datetime.now(timezone.utc)


def micro_time(moment: datetime) -> str:
    """A Lease's MicroTime (RFC 3339 with microseconds)."""
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(text: str | None) -> datetime | None:
    if not text:
        return None
    text = text.replace("Z", "+00:00")
    return datetime.fromisoformat(text)


def may_take(spec: dict[str, Any] | None, identity: str, now: datetime) -> bool:
    """True when ``identity`` may hold the Lease: nobody holds it, it is ours, or its holder stopped renewing."""
    spec = spec or {}
    holder = spec.get("holderIdentity")
    if not holder or holder == identity:
        return True
    renewed = _parse(spec.get("renewTime") or spec.get("acquireTime"))
    duration = spec.get("leaseDurationSeconds") or 0
    return renewed is None or (now - renewed).total_seconds() > duration


def taken(spec: dict[str, Any] | None, identity: str, now: datetime, lease_seconds: int) -> dict[str, Any]:
    """The Lease spec once ``identity`` took (or renewed) it."""
    spec = spec or {}
    new_holder = spec.get("holderIdentity") != identity
    return {
        "holderIdentity": identity,
        "leaseDurationSeconds": lease_seconds,
        "acquireTime": micro_time(now) if new_holder or not spec.get("acquireTime") else spec["acquireTime"],
        "renewTime": micro_time(now),
        "leaseTransitions": (spec.get("leaseTransitions") or 0) + (1 if new_holder and spec.get("holderIdentity") else 0),
    }


class LeaderElector:
    """Takes and keeps one Lease; ``on_lost`` runs (once) when it could not renew in time."""

    def __init__(self, kube: Kube, namespace: str, name: str, identity: str, *, lease_seconds: int = 15,
                 renew_seconds: float = 5, on_lost: Callable[[], None] | None = None):
        self.kube, self.namespace, self.name, self.identity = kube, namespace, name, identity
        self.lease_seconds, self.renew_seconds = lease_seconds, renew_seconds
        self.on_lost = on_lost
        self._stop = threading.Event()

    def try_take(self) -> bool:
        """One attempt: create, take over or renew the Lease. False when someone else holds it (or won a race)."""
        lease = self.kube.get(LEASE_API, "Lease", self.namespace, self.name)
        now = _now()
        if lease is None:
            body = {"apiVersion": LEASE_API, "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace},
                    "spec": taken(None, self.identity, now, self.lease_seconds)}
            _, created = self.kube.create(body)
            return created
        if not may_take(lease.get("spec"), self.identity, now):
            return False
        lease["spec"] = taken(lease.get("spec"), self.identity, now, self.lease_seconds)
        try:
            self.kube.replace(lease)  # carries metadata.resourceVersion: a concurrent writer gets 409
        except KubeError as exc:
            if exc.status == 409:
                return False
            raise
        return True

    def acquire(self) -> None:
        """Block until this replica leads."""
        logged = False
        while not self._stop.is_set():
            try:
                if self.try_take():
                    log.info("leading: Lease %s/%s held by %s", self.namespace, self.name, self.identity)
                    return
            except KubeError as exc:
                log.warning("cannot take Lease %s/%s: %s", self.namespace, self.name, exc)
            if not logged:
                log.info("waiting for Lease %s/%s (another replica leads)", self.namespace, self.name)
                logged = True
            self._stop.wait(self.renew_seconds)

    def keep(self) -> threading.Thread:
        """Renew in a daemon thread; call ``on_lost`` when no renewal succeeded for ``lease_seconds``."""

        def loop() -> None:
            last = time.monotonic()
            while not self._stop.wait(self.renew_seconds):
                try:
                    if self.try_take():
                        last = time.monotonic()
                        continue
                    log.error("Lease %s/%s was taken by another replica", self.namespace, self.name)
                except Exception as exc:  # noqa: BLE001 - the deadline below decides
                    log.warning("cannot renew Lease %s/%s: %s", self.namespace, self.name, exc)
                    if time.monotonic() - last < self.lease_seconds:
                        continue
                log.error("lost leadership of Lease %s/%s: stopping", self.namespace, self.name)
                if self.on_lost is not None:
                    self.on_lost()
                return

        thread = threading.Thread(target=loop, name="forge-replay-lease", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self._stop.set()
