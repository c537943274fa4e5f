"""render(job, settings) -> the Kubernetes objects the operator creates for a ForgeReplayJob.

Pure functions: a validated ForgeReplayJob in, plain dicts out (ready for the API server or
for `forge-replay render FILE`). Creation order is the list order: the RayJob comes last and is
created only once the verify Job (when ``replay.verify``) has succeeded.
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

from forge_replay.api import API_VERSION, KIND, ForgeReplayJob, ObjectMeta
from forge_replay.api import paths
from forge_replay.api.job import MUTABLE_AFTER_LAUNCH
from forge_replay.api.runtime_config import RuntimeConfig
from forge_replay.backends import entry, launch
from forge_replay.backends.argv import worker_nodes
from forge_replay.backends.publish import PROBE_FOLDER
from forge_replay.controller import naming
from forge_replay.controller.settings import OperatorSettings
from forge_replay.dumps.verify_record import RECORD_FILE
from forge_replay.dumps.verify_request import verify_command

ENTRYPOINT = f"python -m forge_replay.runtime --config {paths.CONFIG_PATH}"
GPU_RESOURCE = "nvidia.com/gpu"
HEAD_CONTAINER = "ray-head"
WORKER_CONTAINER = "ray-worker"
SUBMITTER_CONTAINER = "ray-job-submitter"
TRAINER_GROUP = "trainer"
ROLLOUT_GROUP = "rollout"


def render(job: ForgeReplayJob, settings: OperatorSettings | None = None) -> list[dict[str, Any]]:
    """Every child object of ``job``, in the order the operator creates them."""
    settings = settings or OperatorSettings()
    objects = [config_map(job, settings), progress_map(job, settings), *runtime_rbac(job, settings)]
    if job.spec.replay.verify:
        objects.append(verify_job(job, settings))
    objects.append(ray_job(job, settings))
    return objects


def spec_hash(job: ForgeReplayJob) -> str:
    """Hash of everything in the spec that is frozen at launch (all of it but ``suspend``)."""
    return hashlib.sha256(json.dumps(frozen_spec(job), sort_keys=True).encode()).hexdigest()[:16]


def frozen_spec(job: ForgeReplayJob) -> dict[str, Any]:
    """The normalized spec minus ``suspend`` (MUTABLE_AFTER_LAUNCH): what may not change once children exist."""
    return job.spec.model_dump(mode="json", by_alias=True, exclude_none=True, exclude=set(MUTABLE_AFTER_LAUNCH))


def owner_reference(job: ForgeReplayJob) -> dict[str, Any] | None:
    """The controller owner reference to ``job``; None when the job has no uid (rendered from a file)."""
    if not job.metadata.uid:
        return None
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": job.metadata.name,
        "uid": job.metadata.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def runtime_config(job: ForgeReplayJob, settings: OperatorSettings) -> RuntimeConfig:
    """The runtime's input file: the job (name, namespace, spec) plus the mount points."""
    meta = ObjectMeta(name=job.metadata.name, namespace=job.metadata.namespace)
    clean = ForgeReplayJob(metadata=meta, spec=job.spec)
    return RuntimeConfig(
        job=clean,
        dumps_root=paths.DUMPS_MOUNT,
        results_dir=_results_dir(job),
        model_root=paths.MODEL_MOUNT if job.spec.model.path else None,
        engine_command=settings.engine_command,
        progress_configmap=naming.progress_map_name(_name(job)),
        baseline_path=_baseline_file(job),
        history_root=paths.RESULTS_MOUNT if _history(job) and job.spec.results.claim_name else None,
        verify_record=_verify_record(job),
    )


def _verify_record(job: ForgeReplayJob) -> str | None:
    """Where the verify Job records what it checked, for the runtime's pre-flight to trust: the run's folder of the
    results claim, which both mount; None without the verify Job or a results claim (the runtime verifies all), and
    for slime / miles: the verify Job (uid 10001) would make the run's folder before the team's image, whose root
    user (no CAP_DAC_OVERRIDE in our pods) then cannot write its probe and report there (found by e2e scenario 7).
    Their verify Job's notes stay in its log; `forge-replay run --trainer-root` records them locally."""
    if not (job.spec.replay.verify and job.spec.results.claim_name) or _byo(job):
        return None
    return f"{_results_dir(job)}/{RECORD_FILE}"


def _results_dir(job: ForgeReplayJob) -> str:
    """The run's own folder of the results PVC (or of an emptyDir when spec.results.claimName is empty)."""
    return f"{paths.RESULTS_MOUNT}/{naming.results_folder(job.metadata.namespace, _name(job), job.metadata.uid)}"


def _history(job: ForgeReplayJob) -> bool:
    """Whether spec.expect.baseline.history is set: the runtime reads the trusted runs from the results claim's root
    (mounted whole, read-write, in every Ray pod), and there is no baseline volume."""
    baseline = job.spec.expect.baseline if job.spec.expect is not None else None
    return baseline is not None and baseline.history is not None


def _baseline_file(job: ForgeReplayJob) -> str | None:
    """Where the runtime reads spec.expect.baseline: its ConfigMap's report.json, or its path on the PVC (None for
    spec.expect.baseline.history)."""
    baseline = job.spec.expect.baseline if job.spec.expect is not None else None
    if baseline is None or baseline.history is not None:
        return None
    return f"{paths.BASELINE_MOUNT}/{baseline.path if baseline.path else 'report.json'}"


def _baseline_volume(job: ForgeReplayJob) -> dict[str, Any]:
    """spec.expect.baseline as a read-only volume (``_baseline_file`` is the file on it)."""
    baseline = job.spec.expect.baseline
    if baseline.config_map_name:
        return {"name": "baseline", "configMap": {"name": baseline.config_map_name}}
    return {"name": "baseline", "persistentVolumeClaim": {"claimName": baseline.claim_name, "readOnly": True}}


def config_map(job: ForgeReplayJob, settings: OperatorSettings) -> dict[str, Any]:
    """ConfigMap ``<name>-config`` with ``config.yaml`` (mounted at CONFIG_DIR in every Ray pod)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(job, naming.config_map_name(_name(job)), settings),
        "data": {paths.CONFIG_FILE: runtime_config(job, settings).to_yaml()},
    }


def progress_map(job: ForgeReplayJob, settings: OperatorSettings) -> dict[str, Any]:
    """ConfigMap ``<name>-progress``, created empty; the runtime patches ``progress.json`` into it."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(job, naming.progress_map_name(_name(job)), settings),
        "data": {},
    }


def runtime_rbac(job: ForgeReplayJob, settings: OperatorSettings) -> list[dict[str, Any]]:
    """ServiceAccount + Role + RoleBinding: the runtime may only get/patch its own progress ConfigMap."""
    name = naming.runtime_account_name(_name(job))
    account = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _metadata(job, name, settings),
        "automountServiceAccountToken": False,
    }
    if job.spec.pod.image_pull_secrets:
        account["imagePullSecrets"] = _pull_secrets(job)
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _metadata(job, name, settings),
        "rules": [
            {
                "apiGroups": [""],
                "resources": ["configmaps"],
                "resourceNames": [naming.progress_map_name(_name(job))],
                "verbs": ["get", "patch"],
            }
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _metadata(job, name, settings),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, **_namespace_field(job)}],
    }
    return [account, role, binding]


def verify_job(job: ForgeReplayJob, settings: OperatorSettings) -> dict[str, Any]:
    """Batch Job ``<name>-verify``: checks every needed dump exists and loads, before any GPU is asked for."""
    name = naming.verify_job_name(_name(job))
    container = {
        "name": "verify",
        "image": settings.image_for(job.spec.image),
        "imagePullPolicy": "IfNotPresent",
        "command": verify_command(job, record=_verify_record(job)),
        "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}, *_user_env(job)],
        "resources": _verify_resources(job),
        "securityContext": _container_security(),
        # Whatever verify printed becomes the termination message, and so the condition message.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [{"name": "dumps", "mountPath": paths.DUMPS_MOUNT, "readOnly": True}],
    }
    volumes = [_dumps_volume(job)]
    if job.spec.model.path:  # its config.json gives the vocabulary and positions verify checks against
        volumes.append(_model_volume(job))
        container["volumeMounts"].append({"name": "model", "mountPath": paths.MODEL_MOUNT, "readOnly": True})
    if _verify_record(job):  # the record of what it checked, in the run's folder (the runtime trusts it)
        volumes.append({"name": "results", "persistentVolumeClaim": {"claimName": job.spec.results.claim_name}})
        container["volumeMounts"].append({"name": "results", "mountPath": paths.RESULTS_MOUNT})
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _metadata(job, name, settings, role="verify"),
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": settings.verify_deadline_seconds,
            "template": {
                "metadata": _pod_metadata(job, settings, "verify"),
                "spec": {
                    "restartPolicy": "Never",
                    **_pod_identity(job, token=False),
                    "securityContext": _pod_security(settings),
                    "containers": [container],
                    "volumes": volumes,
                },
            },
        },
    }


def _verify_resources(job: ForgeReplayJob) -> dict[str, Any]:
    """spec.replay.verifyResources: whole CPUs requested (verify runs that many workers), memory requested and
    limited."""
    wanted = job.spec.replay.verify_resources
    memory = f"{wanted.memory_gib}Gi"
    return {"requests": {"cpu": str(wanted.cpus), "memory": memory}, "limits": {"memory": memory}}


def ray_job(job: ForgeReplayJob, settings: OperatorSettings) -> dict[str, Any]:
    """The KubeRay RayJob (same name as the job): head, trainer group and, in forge mode, the engines."""
    spec = job.spec
    queued = bool(spec.scheduling.queue_name)
    metadata = _metadata(job, naming.ray_job_name(_name(job)), settings)
    if _byo(job):
        metadata.setdefault("annotations", {})[naming.ANNOTATION_ENTRYPOINT] = byo_shell_line(job)
    if queued:
        metadata["labels"][naming.LABEL_KUEUE_QUEUE] = spec.scheduling.queue_name
    workers = [_trainer_group(job, settings)]
    rollout = _rollout_group(job, settings)
    if rollout is not None:
        workers.append(rollout)
    return {
        "apiVersion": f"{naming.RAY_GROUP}/{naming.RAY_VERSION}",
        "kind": naming.RAY_KIND,
        "metadata": metadata,
        "spec": {
            "entrypoint": _entrypoint(job),
            **_byo_runtime_env(job, settings),
            "submissionMode": "K8sJobMode",
            "shutdownAfterJobFinishes": True,
            "ttlSecondsAfterFinished": spec.ttl_seconds_after_finished,
            **({"activeDeadlineSeconds": spec.active_deadline_seconds} if spec.active_deadline_seconds else {}),
            # Kueue admits a queued RayJob by unsuspending it, so it must be created suspended.
            "suspend": spec.suspend or queued,
            "submitterPodTemplate": _submitter_template(job, settings),
            "rayClusterSpec": {
                "rayVersion": settings.ray_version,
                "headGroupSpec": {
                    # num-cpus 0: nothing of the job is placed on the head (its driver and managers take no CPU);
                    # a CPU trainer (gpusPerNode: 0) goes to its own pod, not the head's GCS and small memory.
                    "rayStartParams": {"dashboard-host": "0.0.0.0", "num-cpus": "0", "num-gpus": "0"},
                    "template": _head_template(job, settings),
                },
                "workerGroupSpecs": workers,
            },
        },
    }


# --------------------------------------------------------------------------------------- helpers


def _name(job: ForgeReplayJob) -> str:
    if not job.metadata.name:
        raise ValueError("metadata.name: required to render a ForgeReplayJob's objects")
    return job.metadata.name


def _namespace_field(job: ForgeReplayJob) -> dict[str, str]:
    return {"namespace": job.metadata.namespace} if job.metadata.namespace else {}


def _metadata(
    job: ForgeReplayJob, name: str, settings: OperatorSettings, role: str | None = None
) -> dict[str, Any]:
    labels = naming.child_labels(_name(job), settings.extra_labels)
    if role:
        labels[naming.LABEL_ROLE] = role
    meta: dict[str, Any] = {"name": name, **_namespace_field(job), "labels": labels}
    meta["annotations"] = {naming.ANNOTATION_SPEC_HASH: spec_hash(job)}
    owner = owner_reference(job)
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return meta


def _pod_security(settings: OperatorSettings) -> dict[str, Any]:
    uid = settings.runtime_uid
    return {
        "runAsNonRoot": True,
        "runAsUser": uid,
        "runAsGroup": uid,
        "fsGroup": uid,
        # A large results/model volume is chown'ed once, not at every pod start.
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _pull_secrets(job: ForgeReplayJob) -> list[dict[str, str]]:
    return [{"name": s.name} for s in job.spec.pod.image_pull_secrets]


def _user_env(job: ForgeReplayJob) -> list[dict[str, Any]]:
    return [e.model_dump(mode="json", by_alias=True, exclude_none=True) for e in job.spec.pod.env]


def _pod_identity(job: ForgeReplayJob, *, token: bool) -> dict[str, Any]:
    """Every pod of the job runs as ``<name>-runtime`` (its pull secrets); only the head mounts the token."""
    identity: dict[str, Any] = {
        "serviceAccountName": naming.runtime_account_name(_name(job)),
        "automountServiceAccountToken": token,
    }
    if job.spec.pod.image_pull_secrets:
        identity["imagePullSecrets"] = _pull_secrets(job)
    return identity


def _pod_metadata(job: ForgeReplayJob, settings: OperatorSettings, role: str) -> dict[str, Any]:
    """A pod template's labels (spec.pod.labels, then ours) and annotations (spec.pod.annotations)."""
    pod = job.spec.pod
    labels = dict(pod.labels) | naming.child_labels(_name(job), settings.extra_labels) | {naming.LABEL_ROLE: role}
    meta: dict[str, Any] = {"labels": labels}
    if pod.annotations:
        meta["annotations"] = dict(pod.annotations)
    return meta


def _container_security() -> dict[str, Any]:
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def _dumps_volume(job: ForgeReplayJob) -> dict[str, Any]:
    claim = {"claimName": job.spec.replay.dumps.claim_name, "readOnly": True}
    return {"name": "dumps", "persistentVolumeClaim": claim}


def _model_volume(job: ForgeReplayJob) -> dict[str, Any]:
    return {"name": "model", "persistentVolumeClaim": {"claimName": job.spec.model.claim_name, "readOnly": True}}


def _volumes(job: ForgeReplayJob, settings: OperatorSettings, shm_size: str) -> tuple[list[dict], list[dict]]:
    """Volumes and mounts shared by every Ray pod: dumps (ro), config (ro), /dev/shm, model (ro), results."""
    volumes: list[dict[str, Any]] = [
        _dumps_volume(job),
        {"name": "config", "configMap": {"name": naming.config_map_name(_name(job))}},
        # /dev/shm counts against the container's memory limit: never larger than that limit.
        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": shm_size}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "dumps", "mountPath": paths.DUMPS_MOUNT, "readOnly": True},
        {"name": "config", "mountPath": paths.CONFIG_DIR, "readOnly": True},
        {"name": "shm", "mountPath": "/dev/shm"},
    ]
    if _baseline_file(job):  # the runtime compares with spec.expect.baseline when the run ends
        volumes.append(_baseline_volume(job))
        mounts.append({"name": "baseline", "mountPath": paths.BASELINE_MOUNT, "readOnly": True})
    model = job.spec.model
    if model.path:
        volumes.append(_model_volume(job))
        mounts.append({"name": "model", "mountPath": paths.MODEL_MOUNT, "readOnly": True})
    results = job.spec.results.claim_name
    if results:
        volumes.append({"name": "results", "persistentVolumeClaim": {"claimName": results}})
    else:
        # No results PVC: the runtime still writes its report somewhere writable (lost with the pod).
        volumes.append({"name": "results", "emptyDir": {}})
    mounts.append({"name": "results", "mountPath": paths.RESULTS_MOUNT})
    return volumes, mounts


def _env(job: ForgeReplayJob) -> list[dict[str, Any]]:
    return [
        {"name": "FORGE_REPLAY_CONFIG", "value": paths.CONFIG_PATH},
        {"name": "FORGE_REPLAY_JOB", "value": _name(job)},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
        *_user_env(job),
    ]


def _pod_template(
    job: ForgeReplayJob,
    settings: OperatorSettings,
    *,
    role: str,
    container: dict[str, Any],
    gpu_group: bool,
) -> dict[str, Any]:
    limit = container["resources"]["limits"]["memory"]
    volumes, mounts = _volumes(job, settings, min_quantity(settings.shm_size, limit))
    container = {
        "image": _ray_image(job, settings),
        "imagePullPolicy": "IfNotPresent",
        **container,
        "env": _env(job),
        "securityContext": _container_security(),
        "volumeMounts": mounts,
    }
    # Only the driver (on the head) publishes progress, so only the head gets the token.
    spec: dict[str, Any] = {"securityContext": _ray_pod_security(job, settings),
                            **_pod_identity(job, token=role == "head")}
    spec["containers"] = [container]
    spec["volumes"] = volumes
    _add_forge_lib(job, settings, spec)
    scheduling = job.spec.scheduling
    if gpu_group:
        if scheduling.node_selector:
            spec["nodeSelector"] = dict(scheduling.node_selector)
        if scheduling.tolerations:
            spec["tolerations"] = [
                t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in scheduling.tolerations
            ]
        if scheduling.affinity:  # copies: each pod template owns its dicts (no YAML anchors, no aliasing)
            spec["affinity"] = copy.deepcopy(scheduling.affinity)
        if scheduling.topology_spread_constraints:
            spec["topologySpreadConstraints"] = copy.deepcopy(scheduling.topology_spread_constraints)
    if scheduling.priority_class_name:  # head too: a preempted head takes the whole Ray cluster with it
        spec["priorityClassName"] = scheduling.priority_class_name
    return {"metadata": _pod_metadata(job, settings, role), "spec": spec}


def _head_template(job: ForgeReplayJob, settings: OperatorSettings) -> dict[str, Any]:
    container = {
        "name": HEAD_CONTAINER,
        "ports": [
            {"name": "gcs", "containerPort": 6379},
            {"name": "dashboard", "containerPort": 8265},
            {"name": "client", "containerPort": 10001},
        ],
        "resources": {
            "requests": {"cpu": settings.head_cpu, "memory": settings.head_memory},
            "limits": {"memory": settings.head_memory},
        },
    }
    return _pod_template(job, settings, role="head", container=container, gpu_group=False)


def _gpu_resources(gpus: int, settings: OperatorSettings, extra_resources: dict[str, str]) -> dict[str, Any]:
    if gpus == 0:
        return {
            "requests": {"cpu": settings.cpu_worker_cpu, "memory": settings.cpu_worker_memory},
            "limits": {"memory": settings.cpu_worker_memory},
        }
    memory = f"{gpus * settings.worker_memory_gib_per_gpu}Gi"
    extra = dict(extra_resources)  # e.g. rdma/ib: extended resources need requests == limits
    return {
        "requests": {"cpu": str(gpus * settings.worker_cpus_per_gpu), "memory": memory, **extra},
        "limits": {"memory": memory, GPU_RESOURCE: gpus, **extra},
    }


def _worker_group(
    job: ForgeReplayJob, settings: OperatorSettings, *, group: str, replicas: int, gpus: int,
    ray_start_params: dict[str, str] | None = None,
) -> dict[str, Any]:
    container = {"name": WORKER_CONTAINER, "resources": _gpu_resources(gpus, settings, job.spec.pod.extra_resources)}
    return {
        "groupName": group,
        "replicas": replicas,
        "minReplicas": replicas,
        "maxReplicas": replicas,
        "rayStartParams": ray_start_params or {},
        "template": _pod_template(job, settings, role=group, container=container, gpu_group=True),
    }


def _trainer_group(job: ForgeReplayJob, settings: OperatorSettings) -> dict[str, Any]:
    trainer = job.spec.trainer
    # slime / miles place engines and actors themselves in one placement group: one homogeneous group for both.
    replicas = worker_nodes(job.spec) if _byo(job) else trainer.nodes
    return _worker_group(job, settings, group=TRAINER_GROUP, replicas=replicas, gpus=trainer.gpus_per_node)


def _rollout_group(job: ForgeReplayJob, settings: OperatorSettings) -> dict[str, Any] | None:
    """One pod per sglang engine (numGpusPerEngine GPUs each, none with ``gpusPerNode: 0`` as the runtime gives the
    engines none); None in debug mode or when colocated.

    Each pod offers one ``ENGINE_RAY_RESOURCE`` and no CPU to Ray: engines (which take one each and no CPU) run
    there, the trainer's bundles (a CPU each) never do."""
    rollout = job.spec.rollout
    if job.spec.replay.mode != "forge" or rollout is None or rollout.colocate or _byo(job):
        return None
    gpus = rollout.num_gpus_per_engine if job.spec.trainer.gpus_per_node > 0 else 0
    # Single quotes: KubeRay puts the value into the shell command of `ray start`, and reads it as JSON itself
    # after trimming them (kuberay v1.5.0 controllers/ray/common/pod.go getResourcesMap).
    params = {"num-cpus": "0", "resources": f"'{json.dumps({paths.ENGINE_RAY_RESOURCE: 1})}'"}
    return _worker_group(job, settings, group=ROLLOUT_GROUP, replicas=rollout.num_engines, gpus=gpus,
                         ray_start_params=params)


def _submitter_template(job: ForgeReplayJob, settings: OperatorSettings) -> dict[str, Any]:
    """KubeRay's `ray job submit` pod, non-root like the rest; KubeRay fills in its command."""
    return {
        "metadata": _pod_metadata(job, settings, "submitter"),
        "spec": {
            "restartPolicy": "Never",
            **_pod_identity(job, token=False),
            "securityContext": _ray_pod_security(job, settings),
            "containers": [
                {
                    "name": SUBMITTER_CONTAINER,
                    "image": _ray_image(job, settings),
                    "imagePullPolicy": "IfNotPresent",
                    "resources": {
                        "requests": {"cpu": "500m", "memory": "256Mi"},
                        "limits": {"cpu": "1", "memory": "1Gi"},
                    },
                    "securityContext": _container_security(),
                    **({"env": _user_env(job)} if job.spec.pod.env else {}),
                }
            ],
        },
    }


# ------------------------------------------------------------ bring your own trainer (slime, miles)


def _byo(job: ForgeReplayJob) -> bool:
    return job.spec.trainer.backend != "builtin"


def byo_shell_line(job: ForgeReplayJob) -> str:
    """What a slime / miles job runs on the Ray head: ``cd <workingDir> && python3 <script> <args + injected>``, then
    the memory report's publish step (also the RayJob's ``forgereplay.io/entrypoint`` annotation, for review)."""
    return launch.entrypoint(job.spec, paths.DUMPS_MOUNT, results_dir=_results_dir(job), job_name=_name(job),
                             progress_configmap=naming.progress_map_name(_name(job)))


def _entrypoint(job: ForgeReplayJob) -> str:
    """Our runtime for the builtin trainer; the slime / miles shell line through ``backends.entry`` else (KubeRay
    pastes an entrypoint into its submitter's shell: the line's operators would run there)."""
    if not _byo(job):
        return ENTRYPOINT
    return entry.encode(byo_shell_line(job))


def _byo_runtime_env(job: ForgeReplayJob, settings: OperatorSettings) -> dict[str, Any]:
    """slime's / miles' runtime env (PYTHONPATH, CUDA_DEVICE_MAX_CONNECTIONS, spec.trainer.env) as runtimeEnvYAML,
    with the memory probe in every Ray worker writing under the run's results folder."""
    if not _byo(job):
        return {}
    probe_dir = f"{_results_dir(job)}/{PROBE_FOLDER}"
    env = launch.with_probe(launch.runtime_env(job.spec), probe_dir)
    return {"runtimeEnvYAML": json.dumps(env, sort_keys=True)}  # JSON is YAML


def _ray_image(job: ForgeReplayJob, settings: OperatorSettings) -> str:
    """Every Ray pod (submitter included) runs the team's image with slime / miles: Ray versions must match."""
    return job.spec.trainer.image if _byo(job) else settings.image_for(job.spec.image)


def _ray_pod_security(job: ForgeReplayJob, settings: OperatorSettings) -> dict[str, Any]:
    """Ours (non-root, our uid) for the builtin trainer; with slime / miles the team's image keeps its own user
    (their images run as root with the code under /root, which our uid could not enter)."""
    security = _pod_security(settings)
    if _byo(job):
        for key in ("runAsNonRoot", "runAsUser", "runAsGroup"):
            security.pop(key)
    return security


def _add_forge_lib(job: ForgeReplayJob, settings: OperatorSettings, pod_spec: dict[str, Any]) -> None:
    """slime / miles: an init container copies forge_replay from our runtime image into a shared emptyDir,
    mounted read-only in the Ray container and put on PYTHONPATH by the runtime env."""
    if not _byo(job):
        return
    image = settings.image_for(job.spec.image)
    uid = settings.runtime_uid  # our image's own user, whatever the team's pods run as
    security = {**_container_security(), "runAsNonRoot": True, "runAsUser": uid, "runAsGroup": uid}
    pod_spec["initContainers"] = [launch.forge_lib_init_container(image, security)]
    pod_spec["volumes"].append(launch.forge_lib_volume())
    pod_spec["containers"][0]["volumeMounts"].append(launch.forge_lib_mount())


_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18, "": 1}


def quantity_bytes(quantity: str) -> float:
    """A Kubernetes memory quantity ("16Gi", "8G", "512Mi", "1e9") in bytes."""
    text = str(quantity).strip()
    for suffix, factor in (*_BINARY.items(), *_DECIMAL.items()):
        if suffix and text.endswith(suffix):
            return float(text[: -len(suffix)]) * factor
    return float(text)


def min_quantity(a: str, b: str) -> str:
    """The smaller of two memory quantities, as written."""
    return a if quantity_bytes(a) <= quantity_bytes(b) else b
