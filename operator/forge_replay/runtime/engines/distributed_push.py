"""The fleet's distributed weight push: every engine joins the trainer's weight-sync group, then receives each
bucket by broadcast while the fleet announces it (sglang's ``/init_weights_update_group`` and
``/update_weights_from_distributed``). A part of :class:`~forge_replay.runtime.engines.fleet.EngineFleet`, in a module
of its own for size; it uses the fleet's ``urls``, ``settings``, ``_each``, ``_watching`` and ``_refused_for_memory``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed

from forge_replay.api.outcome import RanOutOfMemory
from forge_replay.runtime.engines.http import EngineHTTPError, engine_call
from forge_replay.runtime.weights.calls import WeightSyncError, post_weight_request
from forge_replay.runtime.weights.distributed import ParamMeta, WeightGroup, distributed_update_body, init_group_body

log = logging.getLogger(__name__)

NO_DISTRIBUTED_HINT = (
    "this engine server lacks sglang's distributed weight update; set spec.rollout.weightSync: disk to push "
    "checkpoints through /update_weights_from_disk instead"
)


class DistributedPush:
    """The distributed weight push of :class:`~forge_replay.runtime.engines.fleet.EngineFleet`."""

    _weight_group: WeightGroup | None

    def init_weight_group(self, group: WeightGroup) -> None:
        """The distributed path: every engine joins ``group`` (trainer rank 0 joins at the same time);
        engines still in an older group leave it first."""
        old, self._weight_group = self._weight_group, None
        if old is not None:
            self._each(lambda url: self._leave_weight_group(url, old.group_name))
        with self._watching():
            self._join_weight_group(group)
        self._weight_group = group

    def _join_weight_group(self, group: WeightGroup) -> None:
        urls = self.urls
        # The first refusal is raised at once: the engines that did join wait in the group's rendezvous for the
        # missing member (sglang's own timeout, far longer than anyone should wait), and when the trainer gives
        # its side up their requests end; their threads are not waited for.
        pool = ThreadPoolExecutor(max_workers=max(1, min(16, len(urls))))
        try:
            joins = [pool.submit(post_weight_request, url, "/init_weights_update_group",
                                 init_group_body(group, index),
                                 f"joining the weight-sync group {group.group_name} at "
                                 f"{group.master_address}:{group.master_port}",
                                 timeout_s=self.settings.push_timeout_s, hint=NO_DISTRIBUTED_HINT)
                     for index, url in enumerate(urls)]
            for join in as_completed(joins):
                join.result()
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def _leave_weight_group(self, url: str, group_name: str) -> None:
        try:
            engine_call(url, "/destroy_weights_update_group", method="POST", body={"group_name": group_name},
                        timeout_s=self.settings.push_timeout_s)
        except EngineHTTPError as exc:  # a restarted engine never joined it; an older sglang has no endpoint
            log.info("engine %s: leaving weight group %s: %s", url, group_name, exc)

    def update_weights_from_distributed(self, buckets: Sequence[Sequence[ParamMeta]], version: str) -> int:
        """The distributed path: announce every bucket to every engine while trainer rank 0 broadcasts it;
        the last bucket carries ``version``. Returns the number of requests sent.

        An engine that refuses a bucket (sglang answers 400 ``success: false`` once it received the bucket and
        failed to load it) still takes part in the next broadcasts, so it keeps getting them and no member is
        left waiting; one that gave no answer (dead) or a 404 (no such endpoint) gets no more, nor one that ran out
        of memory receiving it (it received only part of it). Every failure is raised at the end, naming the engine;
        an out-of-memory (the engine's answer, or its death) as :class:`RanOutOfMemory`."""
        with self._watching():
            return self._update_weights_from_distributed(buckets, version)

    def _update_weights_from_distributed(self, buckets: Sequence[Sequence[ParamMeta]], version: str) -> int:
        if self._weight_group is None:
            raise WeightSyncError("no weight-sync group formed: init_weight_group must run before a distributed push")
        name = self._weight_group.group_name
        index = {url: i for i, url in enumerate(self.urls)}
        members, errors, sent = list(self.urls), {}, 0
        out_of_memory: RanOutOfMemory | None = None
        for number, bucket in enumerate(buckets, start=1):
            if not members:
                break
            body = distributed_update_body(bucket, name, version if number == len(buckets) else None)

            def post(url: str, number=number, body=body) -> Exception | None:
                try:
                    self._refused_for_memory(url, post_weight_request, url, "/update_weights_from_distributed", body,
                                             f"bucket {number}/{len(buckets)} of weight version {version}",
                                             timeout_s=self.settings.push_timeout_s, hint=NO_DISTRIBUTED_HINT)
                    return None
                except (WeightSyncError, RanOutOfMemory) as exc:
                    return exc

            with ThreadPoolExecutor(max_workers=max(1, min(16, len(members)))) as pool:
                outcomes = list(pool.map(post, members))
            sent += len(members)
            for url, exc in zip(list(members), outcomes):
                if exc is None:
                    continue
                if isinstance(exc, RanOutOfMemory):
                    out_of_memory = out_of_memory or exc
                    members.remove(url)
                    continue
                errors.setdefault(url, f"engine {index[url]}: {exc}")
                cause = exc.__cause__
                if isinstance(cause, EngineHTTPError) and cause.status in (None, 404):  # it will receive nothing
                    members.remove(url)
        if out_of_memory is not None:
            raise out_of_memory
        if errors:
            raise WeightSyncError("; ".join(errors.values()))
        return sent
