"""A small, explicit Kubernetes REST client for the operator's reconcile function.

Only the verbs and resources listed in docs/operator.md are used (the chart derives its RBAC from
that list). Authentication comes from the kubeconfig or the in-cluster ServiceAccount through the
official ``kubernetes`` package; requests go through one ``requests.Session`` so that every call is
counted (``forge_replay_operator_api_requests_total``) and timed out.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import requests

from forge_replay.api import API_VERSION, PLURAL
from forge_replay.errors import Portable

# (apiVersion, kind) -> (URL prefix, plural). Namespaced resources only.
RESOURCES: dict[tuple[str, str], tuple[str, str]] = {
    ("v1", "ConfigMap"): ("/api/v1", "configmaps"),
    ("v1", "ServiceAccount"): ("/api/v1", "serviceaccounts"),
    ("v1", "Pod"): ("/api/v1", "pods"),
    ("v1", "PersistentVolumeClaim"): ("/api/v1", "persistentvolumeclaims"),
    ("v1", "Event"): ("/api/v1", "events"),
    ("rbac.authorization.k8s.io/v1", "Role"): ("/apis/rbac.authorization.k8s.io/v1", "roles"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): ("/apis/rbac.authorization.k8s.io/v1", "rolebindings"),
    ("batch/v1", "Job"): ("/apis/batch/v1", "jobs"),
    ("ray.io/v1", "RayJob"): ("/apis/ray.io/v1", "rayjobs"),
    ("coordination.k8s.io/v1", "Lease"): ("/apis/coordination.k8s.io/v1", "leases"),
    (API_VERSION, "ForgeReplayJob"): (f"/apis/{API_VERSION}", PLURAL),
}


class KubeError(Portable, RuntimeError):
    """An API call failed; ``status`` is the HTTP status, the message names the verb and object."""

    def __init__(self, status: int, message: str):
        self.status = status
        super().__init__(message)


class Kube:
    """Typed-by-convention access to the namespaced objects the operator reads and writes."""

    def __init__(self, kubeconfig: str | None = None, *, timeout: float = 30.0, on_request=None):
        from kubernetes import client, config

        cfg = client.Configuration()
        if kubeconfig:
            config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        else:
            try:
                config.load_incluster_config(client_configuration=cfg)
            except config.ConfigException:
                config.load_kube_config(client_configuration=cfg)
        self._cfg = cfg
        self._timeout = timeout
        self._on_request = on_request
        self._local = threading.local()

    # ------------------------------------------------------------------------------------ plumbing

    def _session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = requests.Session()
            # Only the kubeconfig decides trust: no REQUESTS_CA_BUNDLE, proxies or .netrc from the environment.
            session.trust_env = False
            cfg = self._cfg
            session.verify = cfg.ssl_ca_cert if cfg.verify_ssl and cfg.ssl_ca_cert else cfg.verify_ssl
            if cfg.cert_file and cfg.key_file:
                session.cert = (cfg.cert_file, cfg.key_file)
            self._local.session = session
        return session

    def _request(self, verb: str, method: str, resource: str, url: str, **kwargs: Any) -> requests.Response:
        headers = kwargs.pop("headers", {})
        token = self._cfg.get_api_key_with_prefix("BearerToken", alias="authorization")
        if token:
            headers["Authorization"] = token
        if self._on_request is not None:
            self._on_request(verb, resource)
        return self._session().request(
            method, self._cfg.host + url, headers=headers, timeout=self._timeout, **kwargs
        )

    @staticmethod
    def _url(api_version: str, kind: str, namespace: str, name: str | None = None, sub: str | None = None) -> str:
        prefix, plural = RESOURCES[(api_version, kind)]
        url = f"{prefix}/namespaces/{namespace}/{plural}"
        if name:
            url += f"/{name}"
        if sub:
            url += f"/{sub}"
        return url

    @staticmethod
    def _check(response: requests.Response, what: str) -> dict[str, Any]:
        if response.status_code >= 400:
            try:
                detail = response.json().get("message", response.text)
            except ValueError:
                detail = response.text
            raise KubeError(response.status_code, f"{what}: HTTP {response.status_code}: {detail}")
        return response.json() if response.content else {}

    # ------------------------------------------------------------------------------------- verbs

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """The object, or None when it does not exist."""
        url = self._url(api_version, kind, namespace, name)
        response = self._request("get", "GET", RESOURCES[(api_version, kind)][1], url)
        if response.status_code == 404:
            return None
        return self._check(response, f"get {kind} {namespace}/{name}")

    def create(self, obj: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """Create ``obj``; when it already exists return the existing one. Returns (object, created)."""
        meta = obj["metadata"]
        api_version, kind, namespace, name = obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"]
        url = self._url(api_version, kind, namespace)
        response = self._request("create", "POST", RESOURCES[(api_version, kind)][1], url, json=obj)
        if response.status_code == 409:
            existing = self.get(api_version, kind, namespace, name)
            if existing is not None:
                return existing, False
        return self._check(response, f"create {kind} {namespace}/{name}"), True

    def replace(self, obj: dict[str, Any]) -> dict[str, Any]:
        """PUT ``obj`` (with its metadata.resourceVersion: a concurrent change answers 409)."""
        meta = obj["metadata"]
        api_version, kind, namespace, name = obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"]
        url = self._url(api_version, kind, namespace, name)
        response = self._request("update", "PUT", RESOURCES[(api_version, kind)][1], url, json=obj)
        return self._check(response, f"update {kind} {namespace}/{name}")

    def merge_patch(
        self, api_version: str, kind: str, namespace: str, name: str, patch: dict[str, Any], *, status: bool = False
    ) -> dict[str, Any]:
        """JSON merge patch of the object (or of its status subresource)."""
        url = self._url(api_version, kind, namespace, name, "status" if status else None)
        verb = "patch-status" if status else "patch"
        response = self._request(
            verb,
            "PATCH",
            RESOURCES[(api_version, kind)][1] + ("/status" if status else ""),
            url,
            data=json.dumps(patch),
            headers={"Content-Type": "application/merge-patch+json"},
        )
        return self._check(response, f"patch {kind}{'/status' if status else ''} {namespace}/{name}")

    def list(self, api_version: str, kind: str, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        """Objects of a kind in a namespace matching a label selector."""
        url = self._url(api_version, kind, namespace)
        response = self._request(
            "list", "GET", RESOURCES[(api_version, kind)][1], url, params={"labelSelector": label_selector}
        )
        return self._check(response, f"list {kind} in {namespace} ({label_selector})").get("items") or []

    def list_all(self, api_version: str, kind: str, namespace: str | None = None) -> list[dict[str, Any]]:
        """Every object of a kind, in one namespace or (namespace None) cluster-wide."""
        prefix, plural = RESOURCES[(api_version, kind)]
        url = f"{prefix}/namespaces/{namespace}/{plural}" if namespace else f"{prefix}/{plural}"
        response = self._request("list", "GET", plural, url)
        return self._check(response, f"list {kind} in {namespace or 'all namespaces'}").get("items") or []
