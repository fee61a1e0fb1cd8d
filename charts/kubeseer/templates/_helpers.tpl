{{/* Names: "kubeseer" for a release named kubeseer, else "<release>-kubeseer". */}}
{{- define "kubeseer.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kubeseer.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* One component's object name, e.g. kubeseer-operator. */}}
{{- define "kubeseer.component" -}}
{{- printf "%s-%s" (include "kubeseer.fullname" .root) .component }}
{{- end }}

{{/* Labels of every object of a component. */}}
{{- define "kubeseer.labels" -}}
{{ include "kubeseer.selectorLabels" . }}
app.kubernetes.io/part-of: kubeseer
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* What a component's Deployment, DaemonSet, Service and NetworkPolicy select on. */}}
{{- define "kubeseer.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kubeseer.component" . }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- end }}

{{- define "kubeseer.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The kube-scheduler image: the cluster's own version unless a tag is given. */}}
{{- define "kubeseer.schedulerImage" -}}
{{- $tag := .Values.scheduler.image.tag | default (regexFind "v[0-9]+\\.[0-9]+\\.[0-9]+" .Capabilities.KubeVersion.Version) }}
{{- printf "%s:%s" .Values.scheduler.image.repository $tag }}
{{- end }}

{{- define "kubeseer.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end }}
{{- end }}

{{/* The store's location as KUBESEER_OBSERVATION_STORE reads it; empty when none. */}}
{{- define "kubeseer.storeLocation" -}}
{{- if eq .Values.datasetStore.type "pvc" }}
{{- .Values.datasetStore.mountPath }}
{{- else if eq .Values.datasetStore.type "s3" }}
{{- .Values.datasetStore.s3.url }}
{{- end }}
{{- end }}

{{- define "kubeseer.storeClaim" -}}
{{- .Values.datasetStore.pvc.existingClaim | default (include "kubeseer.component" (dict "root" . "component" "store")) }}
{{- end }}

{{/* Environment shared by the operator and the retraining job: S3 settings. */}}
{{- define "kubeseer.s3Env" -}}
{{- if .Values.s3.endpoint }}
- name: KUBESEER_S3_ENDPOINT
  value: {{ .Values.s3.endpoint | quote }}
{{- end }}
{{- end }}

{{/* Environment of the retraining containers: caches on the scratch volume, S3 credentials. */}}
{{- define "kubeseer.retrainingEnv" -}}
- name: HOME
  value: /tmp
- name: KUBESEER_CACHE_DIR
  value: {{ include "kubeseer.retrainingCache" . }}
{{- if eq .Values.datasetStore.type "s3" }}
{{- include "kubeseer.s3Env" . }}
{{- with .Values.s3.secretName }}
- name: AWS_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: accessKeyId
- name: AWS_SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: secretAccessKey
{{- end }}
{{- end }}
{{- end }}

{{/* The retraining graph cache: on the store's volume (the output claim's for an S3 store), so
that the graphs a run extracts or exports (a replayed zoo's: about 70 minutes) are there for the
next run. Keyed by schema and graph revision, so an upgrade that changes graphs starts anew. */}}
{{- define "kubeseer.retrainingCache" -}}
{{ ternary .Values.datasetStore.mountPath "/var/lib/kubeseer/output" (eq .Values.datasetStore.type "pvc") }}/cache
{{- end }}

{{- define "kubeseer.retrainingMounts" -}}
- name: work
  mountPath: /work
- name: tmp
  mountPath: /tmp
{{- if eq .Values.datasetStore.type "pvc" }}
- name: store
  mountPath: {{ .Values.datasetStore.mountPath }}
{{- else }}
- name: output
  mountPath: /var/lib/kubeseer/output
{{- end }}
{{- end }}

{{/* NetworkPolicy pieces: egress every component needs, and metrics ingress. */}}
{{- define "kubeseer.egressBase" -}}
# DNS, then the API server (host-network, so by port: NetworkPolicy cannot select it).
- ports:
    - {protocol: UDP, port: 53}
    - {protocol: TCP, port: 53}
- ports:
    {{- range .Values.networkPolicy.apiServerPorts }}
    - {protocol: TCP, port: {{ . }}}
    {{- end }}
{{- end }}
{{- define "kubeseer.metricsIngress" -}}
- ports:
    - {protocol: TCP, port: {{ .port }}}
  {{- with .root.Values.networkPolicy.metricsFrom }}
  from:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}
