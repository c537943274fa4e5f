{{/* Full name of the release's objects, at most 63 characters. */}}
{{- define "forge-replay-operator.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "forge-replay-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "forge-replay-operator.labels" -}}
{{ include "forge-replay-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: forge-replay
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "forge-replay-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "forge-replay-operator.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* repository:tag, or repository@digest when a digest is set. Call with (list $image $context). */}}
{{- define "forge-replay-operator.image" -}}
{{- $image := index . 0 -}}
{{- $root := index . 1 -}}
{{- if $image.digest -}}
{{- printf "%s@%s" $image.repository $image.digest -}}
{{- else -}}
{{- printf "%s:%s" $image.repository (default $root.Chart.AppVersion $image.tag) -}}
{{- end -}}
{{- end -}}

{{/*
The permissions the operator uses in a namespace it watches: exactly the verbs and resources listed
in docs/operator.md (one rule list for the ClusterRole and for every namespaced Role).
*/}}
{{- define "forge-replay-operator.rules" -}}
# ForgeReplayJobs: watched by kopf, which patches its own annotations (progress, diff base).
- apiGroups: ["forgereplay.io"]
  resources: ["forgereplayjobs"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["forgereplay.io"]
  resources: ["forgereplayjobs/status"]
  verbs: ["patch"]
# Children carry owner references with blockOwnerDeletion, which clusters running the
# OwnerReferencesPermissionEnforcement admission plugin only allow to whoever may update the owner's finalizers.
- apiGroups: ["forgereplay.io"]
  resources: ["forgereplayjobs/finalizers"]
  verbs: ["update"]
# The RayJob of each ForgeReplayJob (suspend/resume patch it); deletion goes through owner references.
- apiGroups: ["ray.io"]
  resources: ["rayjobs"]
  verbs: ["get", "list", "watch", "create", "patch"]
# The dump-verification Job, and pods: the verify pod's termination message (the DumpsVerified message), why a
# launching Ray pod does not start, whether a failed job's Ray head pod was lost mid-run, the Ray pods' image digests.
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch", "create"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list"]
# The claims a job names (dumps, model, results), checked to exist with a usable access mode before launch.
- apiGroups: [""]
  resources: ["persistentvolumeclaims"]
  verbs: ["get"]
# The job config and the progress ConfigMap the runtime publishes into (the operator patches the Ray pods' image
# digests into it). The operator must itself hold get/patch on configmaps to grant them to the runtime's Role (RBAC
# forbids escalation).
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "list", "watch", "create", "patch"]
# The runtime pods' ServiceAccount, Role and RoleBinding (get/patch of the one progress ConfigMap).
- apiGroups: [""]
  resources: ["serviceaccounts"]
  verbs: ["get", "create"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["get", "create"]
# Events on each phase transition (the reconciler's and kopf's own, both core v1).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- end -}}
