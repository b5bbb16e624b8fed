{{/* Prefix of every object name. */}}
{{- define "accel-dra.fullname" -}}
{{- default "accel-dra" .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{- define "accel-dra.operatorName" -}}{{ include "accel-dra.fullname" . }}-operator{{- end -}}
{{- define "accel-dra.agentName" -}}{{ include "accel-dra.fullname" . }}-node-agent{{- end -}}
{{- define "accel-dra.policyName" -}}{{ include "accel-dra.fullname" . }}-resourceslices-own-node{{- end -}}
{{- define "accel-dra.claimPolicyName" -}}{{ include "accel-dra.fullname" . }}-resourceclaims-own-node{{- end -}}
{{- define "accel-dra.tpuWorkloadsName" -}}{{ include "accel-dra.agentName" . }}-tpu-workloads{{- end -}}

{{/* The admission policies' test for "the caller is the node agent": a ServiceAccount whose name
     contains the agent's, in any namespace (manifests/base/resourceslice-policy.yaml says why). */}}
{{- define "accel-dra.agentMatch" -}}
- name: node-agent-only
  expression: >-
    request.userInfo.username.startsWith("system:serviceaccount:") &&
    request.userInfo.username.split(":").size() == 4 &&
    request.userInfo.username.split(":")[3].contains("{{ include "accel-dra.agentName" . }}")
{{- end -}}

{{/* The policies' variables agentNode (the node in the caller's token) and drivers (the agent's):
     called with the list of the drivers. */}}
{{- define "accel-dra.agentVariables" -}}
- name: agentNode
  expression: >-
    request.userInfo.extra[?"authentication.kubernetes.io/node-name"].orValue([]).size() == 1
    ? request.userInfo.extra["authentication.kubernetes.io/node-name"][0] : ""
- name: drivers
  expression: '[{{ range $i, $d := . }}{{ if $i }}, {{ end }}"{{ $d }}"{{ end }}]'
{{- end -}}

{{/* The drivers whose ResourceSlices the agent publishes: with ComputeDomains, the compute-domain
     driver's too (its claims' status is not the agent's to write, so only the slice policy). */}}
{{- define "accel-dra.sliceDrivers" -}}
{{- $drivers := list .Values.driverNames.gpu .Values.driverNames.tpu -}}
{{- if .Values.resources.computeDomains.enabled -}}
{{- $drivers = append $drivers "compute-domain.nvidia.com" -}}
{{- end -}}
{{- toJson $drivers -}}
{{- end -}}

{{- define "accel-dra.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* Labels of every object but the DeviceClasses (whose managed-by label is the operator's). */}}
{{- define "accel-dra.labels" -}}
{{ include "accel-dra.baseLabels" . }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "accel-dra.baseLabels" -}}
app.kubernetes.io/part-of: accel-dra
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "accel-dra.operatorLabels" -}}
app.kubernetes.io/name: accel-dra-operator
app.kubernetes.io/component: operator
{{- end -}}

{{- define "accel-dra.agentLabels" -}}
app.kubernetes.io/name: accel-dra-node-agent
app.kubernetes.io/component: node-agent
{{- end -}}

{{/* The uninstall hook's objects: run before deletion, in weight order (the argument); a failed
     Job stays for its log. */}}
{{- define "accel-dra.hookAnnotations" -}}
helm.sh/hook: pre-delete
helm.sh/hook-weight: {{ . | quote }}
helm.sh/hook-delete-policy: before-hook-creation,hook-succeeded
{{- end -}}

{{/* Refuse values the components would reject at run time. */}}
{{- define "accel-dra.validate" -}}
{{- if not (has .Values.backend (list "gpu" "tpu" "simulated")) -}}
{{- fail (printf "backend must be gpu, tpu or simulated, not %q" .Values.backend) -}}
{{- end -}}
{{- if not (has .Values.controller.ownership (list "standalone" "all" "none")) -}}
{{- fail (printf "controller.ownership must be standalone, all or none, not %q" .Values.controller.ownership) -}}
{{- end -}}
{{- if not (has .Values.kubeletPlugin.health.taintEffect (list "NoSchedule" "NoExecute")) -}}
{{- fail (printf "kubeletPlugin.health.taintEffect must be NoSchedule or NoExecute, not %q" .Values.kubeletPlugin.health.taintEffect) -}}
{{- end -}}
{{- if not (has .Values.resources.computeDomains.imex.mode (list "driverManaged" "hostManaged")) -}}
{{- fail (printf "resources.computeDomains.imex.mode must be driverManaged or hostManaged, not %q" .Values.resources.computeDomains.imex.mode) -}}
{{- end -}}
{{- if and (eq .Values.backend "simulated") (not .Values.simulated.profiles) -}}
{{- fail "backend simulated needs at least one profile in simulated.profiles" -}}
{{- end -}}
{{- end -}}

{{- /* The IMEX daemon pods' additions (--compute-domain-daemon-overrides): the chart's
     imagePullSecrets, so that daemons pull the release's image as its pods do, unless
     resources.computeDomains.daemonOverrides names its own; empty when there is nothing to add. */}}
{{- define "accel-dra.daemonOverrides" -}}
{{- $overrides := deepCopy (.Values.resources.computeDomains.daemonOverrides | default dict) -}}
{{- if and .Values.imagePullSecrets (not (hasKey $overrides "imagePullSecrets")) -}}
{{- $_ := set $overrides "imagePullSecrets" .Values.imagePullSecrets -}}
{{- end -}}
{{- if $overrides }}{{ toYaml $overrides }}{{ end -}}
{{- end -}}
{{- define "accel-dra.daemonOverridesName" -}}{{ include "accel-dra.operatorName" . }}-compute-domain-daemons{{- end -}}
