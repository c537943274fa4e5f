"""The builtin trainer: one Ray actor per rank, torch.distributed + FSDP2 (``fully_shard``).

``TrainerRank`` is the per-rank worker (plain class, wrapped by ``ray.remote`` in
:class:`TrainerGroup`); ``TrainerSettings`` is derived from the spec by a pure function.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass

from forge_replay.runtime.ports import free_port
from forge_replay.runtime.trainer.batching import MicroBatch, segment_bounds
from forge_replay.runtime.trainer.memory import MemoryProbe, dump_memory_snapshot, start_memory_history
from forge_replay.runtime.trainer.oom import RankWatch, allocator_error, in_phase


@dataclass(frozen=True)
class TrainerSettings:
    """Everything a trainer rank needs, taken from ``spec.trainer`` (and the model source)."""

    world_size: int
    gpus_per_node: int
    nodes: int
    micro_batch_tokens: int
    gradient_checkpointing: bool
    dtype: str
    learning_rate: float
    clip_eps: float
    clip_eps_high: float
    seed: int
    memory_snapshot: bool
    deterministic: bool = False
    """Debug replay: torch's deterministic settings on (``forge_replay.runtime.environment.make_deterministic``)."""

    @property
    def use_gpu(self) -> bool:
        return self.gpus_per_node > 0

    @property
    def backend(self) -> str:
        return "nccl" if self.use_gpu else "gloo"


def trainer_settings(trainer_spec, deterministic: bool = False) -> TrainerSettings:
    """Settings for the trainer group; ``gpusPerNode: 0`` runs one CPU rank per node. ``deterministic``: debug
    replay, which turns torch's deterministic settings on."""
    return TrainerSettings(
        world_size=trainer_spec.nodes * max(trainer_spec.gpus_per_node, 1),
        gpus_per_node=trainer_spec.gpus_per_node,
        nodes=trainer_spec.nodes,
        micro_batch_tokens=trainer_spec.micro_batch_tokens,
        gradient_checkpointing=trainer_spec.gradient_checkpointing,
        dtype=trainer_spec.dtype,
        learning_rate=trainer_spec.learning_rate,
        clip_eps=trainer_spec.clip_eps,
        clip_eps_high=trainer_spec.clip_eps_high if trainer_spec.clip_eps_high is not None else trainer_spec.clip_eps,
        seed=trainer_spec.seed,
        memory_snapshot=trainer_spec.memory_snapshot,
        deterministic=deterministic,
    )


@dataclass
class RankStepResult:
    """What one rank reports for one training step."""

    rank: int
    loss_sum: float
    loss_tokens: float
    clipped_tokens: float
    tokens: int
    micro_batches: int
    grad_norm: float
    seconds: float
    memory: dict

    def to_dict(self) -> dict:
        return asdict(self)


class TrainerRank:
    """One trainer rank: its share of the FSDP2-sharded model and the optimizer state."""

    def __init__(self, rank: int, settings: TrainerSettings):
        self.rank = rank
        self.settings = settings
        self.model = None
        self.optimizer = None
        self.device = "cpu"
        self.probe: MemoryProbe | None = None
        self.weight_group = None
        self.deterministic: dict | None = None
        self.watch = RankWatch(rank)
        """Its phases: the run's phase board told, torch's allocator running out raised as RanOutOfMemory."""

    # -- setup -----------------------------------------------------------------------------
    def alive(self) -> int:
        """A call that answers at once (the driver's check of which rank died)."""
        return self.rank

    def master_address(self) -> tuple[str, int]:
        """This node's address and a free port for the rendezvous (called on rank 0)."""
        import ray

        return ray.util.get_node_ip_address(), free_port()

    def init_process_group(self, master_addr: str, master_port: int) -> None:
        import torch
        import torch.distributed as dist

        os.environ.update(MASTER_ADDR=master_addr, MASTER_PORT=str(master_port))
        if self.settings.deterministic:  # before the first CUDA call: cuBLAS reads its workspace setting once
            from forge_replay.runtime.environment import make_deterministic

            self.deterministic = make_deterministic(self.settings.use_gpu)
        if self.settings.use_gpu:
            torch.cuda.set_device(0)  # Ray exposes exactly this rank's GPU
            self.device = "cuda:0"
        self.watch.device = self.device
        dist.init_process_group(self.settings.backend, rank=self.rank, world_size=self.settings.world_size)
        self.probe = MemoryProbe(self.rank, self.device)

    def watch_memory(self, board, results_dir: str | None) -> dict:
        """From now on tell ``board`` (the run's PhaseBoard) each phase, and on CUDA record (and with memorySnapshot
        write the snapshot of) an out-of-memory the moment it happens. Returns what the driver needs to read this
        rank's death: its pid, host, Ray node and memory cgroup with its OOM-kill count now (the baseline)."""
        import ray

        from forge_replay.runtime.memory_signals import this_process_cgroup
        from forge_replay.runtime.trainer.oom import host_and_pod

        self.watch.arm(board, results_dir, self.settings.memory_snapshot)
        node, pod = host_and_pod()
        return {"rank": self.rank, "pid": os.getpid(), "node": node, "pod": pod, "device": self.device,
                "node_id": ray.get_runtime_context().get_node_id(), "cgroup": this_process_cgroup()}

    @in_phase("setup")
    def setup(self, source: str | dict) -> dict:
        """Build the model, shard it with FSDP2, create AdamW.

        Rank 0 builds the real weights (seeded random init or the checkpoint); the other ranks build
        on the meta device and receive rank 0's weights by broadcast after sharding.
        """
        import torch
        import torch.distributed as dist
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        from forge_replay.runtime.trainer.model import build_model, torch_dtype, transformer_blocks

        dtype = torch_dtype(self.settings.dtype)
        spread = self.settings.world_size > 1
        model = build_model(source, seed=self.settings.seed, gradient_checkpointing=self.settings.gradient_checkpointing,
                            on_meta=spread and self.rank != 0)
        full_state = dict(model.state_dict()) if spread and self.rank == 0 else {}
        num_params = sum(p.numel() for p in model.parameters())
        mesh = init_device_mesh("cuda" if self.settings.use_gpu else "cpu", (self.settings.world_size,))
        policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
        for block in transformer_blocks(model):
            fully_shard(block, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)
        if spread:
            if self.rank != 0:
                model.to_empty(device=self.device)
            set_model_state_dict(
                model, full_state, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
            )
            for _, buffer in model.named_buffers():  # non-persistent buffers (rotary inv_freq) are not in the state
                dist.broadcast(buffer, src=0)
            del full_state
        self.model = model
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=self.settings.learning_rate)
        if self.settings.memory_snapshot:
            start_memory_history()
        device_name = torch.cuda.get_device_name(0) if self.settings.use_gpu else "cpu"
        from forge_replay.runtime.environment import thread_settings

        return {"rank": self.rank, "num_params": num_params, "device": self.device, "device_name": device_name,
                "deterministic": self.deterministic, "threads": thread_settings()}

    # -- training ----------------------------------------------------------------------------
    def train_step(self, step: int, micro_batches: list[MicroBatch], loss_tokens_total: float,
                   rollout_id: int | None = None) -> RankStepResult:
        """One optimizer step over this rank's micro-batches (of rollout ``rollout_id``; ``step`` when not given).

        Each micro-batch's loss is scaled by ``world_size / loss_tokens_total``: FSDP averages
        gradients over ranks, so the result is the token-mean over the whole step, the same for
        any number of ranks. Forward, backward and the optimizer step are phases of :attr:`watch`.
        """
        import torch

        from forge_replay.runtime.trainer.loss import micro_batch_loss, token_log_probs

        assert self.model is not None and self.probe is not None, "setup() must run before train_step()"
        started = time.perf_counter()
        self.watch.rollout = step if rollout_id is None else rollout_id
        phase = self.watch.phase
        self.probe.reset()
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        scale = self.settings.world_size / max(loss_tokens_total, 1.0)
        loss_sum = loss_tokens = clipped = 0.0
        tokens = 0
        for mb in micro_batches:
            with phase("forward"):
                as_tensor = lambda a: torch.tensor(a, device=self.device)  # noqa: E731 (copy: Ray hands read-only)
                input_ids = as_tensor(mb.input_ids).unsqueeze(0)
                bounds = segment_bounds(mb.position_ids)
                cu_seq_lens = torch.tensor(bounds, dtype=torch.int32)  # read on the host: no device sync per layer
                logits = self.model(
                    input_ids=input_ids, position_ids=as_tensor(mb.position_ids).unsqueeze(0), use_cache=False,
                    cu_seq_lens_q=cu_seq_lens,
                ).logits[0, :-1]
                logp = token_log_probs(logits, input_ids[0, 1:])
                parts = micro_batch_loss(
                    logp,
                    as_tensor(mb.old_logp)[1:],
                    as_tensor(mb.has_old_logp)[1:],
                    as_tensor(mb.advantages)[1:],
                    as_tensor(mb.loss_mask)[1:],
                    self.settings.clip_eps,
                    self.settings.clip_eps_high,
                )
            with phase("backward"):
                (parts.loss_sum * scale).backward()
            loss_sum += float(parts.loss_sum.detach())
            loss_tokens += parts.loss_tokens
            clipped += parts.clipped_tokens
            tokens += mb.num_tokens
            del logits, logp, parts
        with phase("optimizerStep"):
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm=math.inf)
            if hasattr(grad_norm, "full_tensor"):
                grad_norm = grad_norm.full_tensor()
            self.optimizer.step()
        memory = self.probe.read()
        return RankStepResult(
            rank=self.rank,
            loss_sum=loss_sum,
            loss_tokens=loss_tokens,
            clipped_tokens=clipped,
            tokens=tokens,
            micro_batches=len(micro_batches),
            grad_norm=float(grad_norm),
            seconds=time.perf_counter() - started,
            memory=memory.to_dict(),
        )

    # -- hooks for weight sync, snapshots, tests --------------------------------------------------
    @in_phase("weightSync")
    def save_hf_checkpoint(self, path: str) -> str | None:
        """Gather the full weights and write a Hugging Face checkpoint to ``path`` (rank 0 writes).

        Every rank must call this (the gather is collective). Returns ``path`` on rank 0.
        """
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if self.rank != 0:
            return None
        os.makedirs(path, exist_ok=True)
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # its "Writing model shards" bar: once per step, ANSI codes in every log
        self.model.save_pretrained(path, state_dict=state)
        return path

    @in_phase("weightSync")
    def checkpoint_files(self, path: str) -> dict[str, bytes] | None:
        """Like :meth:`save_hf_checkpoint`, but rank 0 returns the files' bytes (for Ray's object store)
        and removes its local copy."""
        import shutil

        from forge_replay.runtime.weights.disk import read_checkpoint_files

        written = self.save_hf_checkpoint(path)
        if written is None:
            return None
        try:
            return read_checkpoint_files(written)
        finally:
            shutil.rmtree(written, ignore_errors=True)
            try:
                os.rmdir(os.path.dirname(written.rstrip(os.sep)))  # the run's folder, once its last step is gone
            except OSError:
                pass

    def weight_metadata(self) -> list:
        """What the engines receive per parameter (checkpoint name, full shape, dtype sent), in order."""
        from forge_replay.runtime.trainer.model import torch_dtype
        from forge_replay.runtime.weights.distributed import ParamMeta

        sent = torch_dtype(self.settings.dtype)
        metas = []
        for name, param in self.model.named_parameters():
            dtype = sent if param.dtype.is_floating_point else param.dtype
            metas.append(ParamMeta(name, tuple(param.shape), str(dtype).removeprefix("torch."),
                                   param.numel() * dtype.itemsize))
        return metas

    def join_weight_group(self, group, timeout_s: float) -> str | None:
        """Rank 0 joins the weight-sync group ``group`` (leaving the previous one); other ranks do nothing."""
        if self.rank != 0:
            return None
        from forge_replay.runtime.weights.calls import WeightSyncError
        from forge_replay.runtime.weights.distributed import join_weight_group

        self.leave_weight_group()
        try:
            self.weight_group = join_weight_group(group, 0, timeout_s)
        except Exception as exc:  # noqa: BLE001 - port taken, address not this node's, engines never came
            raise WeightSyncError(
                f"trainer rank 0 could not form the weight-sync group {group.group_name} ({group.backend}) at "
                f"{group.master_address}:{group.master_port}: {type(exc).__name__}: {exc}"
            ) from None
        return group.group_name

    def leave_weight_group(self) -> None:
        import torch.distributed as dist

        old, self.weight_group = self.weight_group, None
        if old is not None:
            try:
                dist.destroy_process_group(old)
            except Exception:  # noqa: BLE001 - a group with a dead member may not tear down cleanly
                pass

    @in_phase("weightSync")
    def broadcast_weights(self, buckets: list) -> int:
        """Every rank gathers each full parameter in bucket order (collective); rank 0 broadcasts it, cast to
        the dtype the engines expect, in the weight group. Returns the number of tensors broadcast.

        A broadcast that fails (an engine died in it) does not stop rank 0 from gathering: the other ranks are
        in the same gathers, and would wait in them for ever. Rank 0 leaves the broken group at once (so the
        engines still in it stop waiting), gathers the rest and raises at the end."""
        import torch
        import torch.distributed as dist

        from forge_replay.runtime.weights.calls import WeightSyncError

        params = dict(self.model.named_parameters())
        sent = 0
        failure = None
        for number, bucket in enumerate(buckets, start=1):
            for meta in bucket:
                param = params[meta.name]
                full = param.full_tensor() if hasattr(param, "full_tensor") else param
                if self.rank == 0 and failure is None:
                    try:
                        if self.weight_group is None:
                            raise RuntimeError("trainer rank 0 is in no weight-sync group")
                        tensor = full.detach().to(getattr(torch, meta.dtype))  # what the engines were told
                        dist.broadcast(tensor.contiguous(), src=0, group=self.weight_group)
                        sent += 1
                    except Exception as exc:  # noqa: BLE001 - raised below, once every rank's gathers are done
                        if allocator_error(exc):  # out of memory: the run ends here (the driver stops every rank)
                            raise
                        first_line = (str(exc).strip().splitlines() or [""])[0]
                        failure = (f"trainer rank 0: broadcasting {meta.name} (bucket {number}/{len(buckets)}) "
                                   f"failed: {type(exc).__name__}: {first_line}")
                        self.leave_weight_group()
                del full
        if failure:
            raise WeightSyncError(failure)
        return sent

    def gpu_location(self):
        """This rank's node and physical GPU (as Ray numbers it): where colocated engines find its tensors."""
        import ray

        from forge_replay.runtime.weights.ipc import TensorSyncError
        from forge_replay.runtime.weights.tensor import RankGPU

        gpus = ray.get_gpu_ids()
        if len(gpus) != 1:
            raise TensorSyncError(f"trainer rank {self.rank} holds {len(gpus)} GPUs ({gpus}), not one: the tensor "
                                  "weight sync needs one GPU per trainer rank, shared with a colocated engine")
        return RankGPU(self.rank, ray.util.get_node_ip_address(), gpus[0])

    @in_phase("weightSync")
    def update_weights_from_tensor(self, buckets: list, feeds: list, version: str, timeout_s: float = 600.0) -> dict:
        """Every rank, bucket by bucket: gather the full tensors (collective), cast to the dtype sent, serialize
        them (CUDA IPC handles); each engine's trainer ranks gather their strings to the engine's first one,
        which posts ``/update_weights_from_tensor`` (the last bucket carries ``version``). No rank drops a
        bucket before every post of it has returned. Returns what this rank sent and posted."""
        import torch
        import torch.distributed as dist

        from forge_replay.runtime.weights.calls import post_weight_request
        from forge_replay.runtime.weights.ipc import TensorSyncError, serialize_named_tensors, update_request_body
        from forge_replay.runtime.weights.tensor import in_tp_order, tp_roles

        control, engine_groups = self._tensor_sync_groups(feeds, timeout_s)
        roles = tp_roles(feeds, self.rank)
        params = dict(self.model.named_parameters())
        sent = {"rank": self.rank, "posts": 0, "tensors": 0}
        for number, bucket in enumerate(buckets, start=1):
            last = number == len(buckets)
            named = []
            for meta in bucket:
                param = params[meta.name]
                full = param.full_tensor() if hasattr(param, "full_tensor") else param
                if roles:
                    named.append((meta.name, full.detach().to(getattr(torch, meta.dtype)).contiguous()))
                del full
            error = None
            serialized = None
            if roles:
                try:
                    serialized = serialize_named_tensors(named)
                    sent["tensors"] += len(named)
                except Exception as exc:  # noqa: BLE001 - reported below, after the gathers (nobody hangs)
                    error = f"trainer rank {self.rank} could not serialize bucket {number}: {exc}"
            for engine, tp in roles:
                feed = feeds[engine]
                poster = feed.ranks[0]
                gathered = [None] * len(set(feed.ranks)) if self.rank == poster else None
                dist.gather_object((tp, serialized), gathered, dst=poster, group=engine_groups[engine])
                if self.rank != poster or error is not None:
                    continue
                try:
                    body = update_request_body(in_tp_order(gathered, feed), flush_cache=last,
                                               weight_version=version if last else None)
                    post_weight_request(feed.url, "/update_weights_from_tensor", body,
                                        f"bucket {number}/{len(buckets)} of weight version {version} as tensors",
                                        timeout_s=timeout_s)
                    sent["posts"] += 1
                except Exception as exc:  # noqa: BLE001 - reported below, after the barrier
                    error = f"trainer rank {self.rank}: {exc}"
            # The barrier: every post of this bucket has returned before any rank frees the tensors.
            errors: list = [None] * self.settings.world_size
            dist.all_gather_object(errors, error, group=control)
            del named
            failed = [e for e in errors if e]
            if failed:
                raise TensorSyncError("; ".join(failed))
        return sent

    def _tensor_sync_groups(self, feeds: list, timeout_s: float):
        """gloo groups for the tensor push (one over all ranks, one per engine's ranks), made once per layout.

        Every rank creates every group, in the same order (``new_group`` is collective)."""
        import datetime

        import torch.distributed as dist

        layout = tuple(feed.ranks for feed in feeds)
        cached = getattr(self, "_tensor_groups", None)
        if cached is not None and cached[0] == layout:
            return cached[1], cached[2]
        timeout = datetime.timedelta(seconds=timeout_s)
        control = dist.new_group(backend="gloo", timeout=timeout)
        per_engine = [dist.new_group(sorted(set(ranks)), backend="gloo", timeout=timeout) for ranks in layout]
        self._tensor_groups = (layout, control, per_engine)
        return control, per_engine

    def parameter_checksum(self) -> float:
        """Sum of all full (unsharded) parameters: lets tests compare runs across world sizes."""
        import torch

        total = torch.zeros((), dtype=torch.float64)
        for param in self.model.parameters():
            full = param.full_tensor() if hasattr(param, "full_tensor") else param
            total += full.detach().double().abs().sum().cpu()
        return float(total)

    def write_memory_snapshot(self, directory: str) -> str | None:
        """Write this rank's CUDA memory snapshot (GPU only; None on CPU)."""
        path = os.path.join(directory, f"memory-snapshot-rank{self.rank}.pickle")
        return path if dump_memory_snapshot(path) else None

    def shutdown(self) -> None:
        import torch.distributed as dist

        self.leave_weight_group()
        if dist.is_initialized():
            dist.destroy_process_group()


class TrainerGroup:
    """The trainer ranks as Ray actors in one placement group; the driver's handle on them."""

    def __init__(self, settings: TrainerSettings, placement_group, *, runtime_env: dict | None = None):
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.settings = settings
        self.watched: list[dict] = []
        remote_rank = ray.remote(TrainerRank)
        self.ranks = []
        for rank in range(settings.world_size):
            options = {
                "num_cpus": 1,
                "num_gpus": 1 if settings.use_gpu else 0,
                "scheduling_strategy": PlacementGroupSchedulingStrategy(
                    placement_group=placement_group, placement_group_bundle_index=rank
                ),
            }
            if runtime_env:
                options["runtime_env"] = runtime_env
            self.ranks.append(remote_rank.options(**options).remote(rank, settings))
        addr, port = ray.get(self.ranks[0].master_address.remote())
        ray.get([r.init_process_group.remote(addr, port) for r in self.ranks])

    def setup(self, source: str | dict) -> list[dict]:
        import ray

        return ray.get([r.setup.remote(source) for r in self.ranks])

    def watch_memory(self, board, results_dir: str | None) -> list[dict]:
        """Every rank tells ``board`` its phases and records an out-of-memory (:meth:`TrainerRank.watch_memory`);
        returns each rank's pid, host, Ray node and memory cgroup baseline, in rank order."""
        import ray

        self.watched = ray.get([r.watch_memory.remote(board, results_dir) for r in self.ranks])
        return self.watched

    def train_step_async(self, step: int, rank_batches: list, loss_tokens_total: float,
                         rollout_id: int | None = None) -> list:
        """Start one step on every rank; ``rank_batches[r]`` is rank r's micro-batches (or a ref to them)."""
        return [r.train_step.remote(step, rank_batches[i], loss_tokens_total, rollout_id)
                for i, r in enumerate(self.ranks)]

    def save_hf_checkpoint(self, path: str) -> str:
        import ray

        return ray.get([r.save_hf_checkpoint.remote(path) for r in self.ranks])[0]

    def checkpoint_files_ref(self, path: str):
        """An ObjectRef to rank 0's checkpoint files (every rank takes part in the gather). The bytes stay
        in Ray's object store until an engine's node fetches them: nothing passes through the driver."""
        import ray

        refs = [r.checkpoint_files.remote(path) for r in self.ranks]
        ray.get(refs[1:])
        ray.wait(refs[:1])
        return refs[0]

    def weight_metadata(self) -> list:
        import ray

        return ray.get(self.ranks[0].weight_metadata.remote())

    def weight_group_address(self) -> tuple[str, int]:
        """Trainer rank 0's node address and a free port there: the weight group's rendezvous."""
        import ray

        return ray.get(self.ranks[0].master_address.remote())

    def join_weight_group_async(self, group, timeout_s: float) -> list:
        return [self.ranks[0].join_weight_group.remote(group, timeout_s)]

    def broadcast_weights_async(self, buckets: list) -> list:
        return [r.broadcast_weights.remote(buckets) for r in self.ranks]

    def gpu_locations(self) -> list:
        """Each rank's node and GPU (:class:`~forge_replay.runtime.weights.tensor.RankGPU`), in rank order."""
        import ray

        return ray.get([r.gpu_location.remote() for r in self.ranks])

    def update_weights_from_tensor_async(self, buckets: list, feeds: list, version: str, timeout_s: float) -> list:
        return [r.update_weights_from_tensor.remote(buckets, feeds, version, timeout_s) for r in self.ranks]

    def parameter_checksum(self) -> float:
        import ray

        return ray.get([r.parameter_checksum.remote() for r in self.ranks])[0]

    def write_memory_snapshots(self, directory: str) -> list[str]:
        import ray

        return [p for p in ray.get([r.write_memory_snapshot.remote(directory) for r in self.ranks]) if p]

    def shutdown(self) -> None:
        import ray

        try:
            ray.get([r.shutdown.remote() for r in self.ranks], timeout=60)
        except Exception:  # noqa: BLE001 - best effort: the actors are killed next anyway
            pass
        for r in self.ranks:
            ray.kill(r)
