{{/* Names, labels and the few fleetserve conventions the chart must follow. */}}

{{- define "fleetserve.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "fleetserve.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "fleetserve.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "fleetserve.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: fleetserve
{{- end }}

{{- define "fleetserve.selectorLabels" -}}
app.kubernetes.io/name: {{ include "fleetserve.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The NATS chart's service name (its nats.fullname, computed the same way). */}}
{{- define "fleetserve.natsName" -}}
{{- $n := .Values.nats | default dict }}
{{- if $n.fullnameOverride }}
{{- $n.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default "nats" $n.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "fleetserve.natsUrl" -}}
{{- if .Values.nats.enabled }}
{{- printf "nats://%s.%s.svc:4222" (include "fleetserve.natsName" .) .Release.Namespace }}
{{- else if .Values.externalNats.url }}
{{- .Values.externalNats.url }}
{{- else }}
{{- fail "nats.enabled is false: set externalNats.url to the NATS that holds the queue" }}
{{- end }}
{{- end }}

{{/* host:port of nats-server's monitoring for KEDA. Through the headless service: on a
cluster KEDA reaches each server as <pod>.<this host> to find the consumer's leader. */}}
{{- define "fleetserve.natsMonitoring" -}}
{{- if .Values.nats.enabled }}
{{- $port := 8222 }}
{{- with .Values.nats.config }}{{ with .monitor }}{{ with .port }}{{ $port = . }}{{ end }}{{ end }}{{ end }}
{{- printf "%s-headless.%s.svc.cluster.local:%v" (include "fleetserve.natsName" .) .Release.Namespace $port }}
{{- else if .Values.externalNats.monitoringEndpoint }}
{{- .Values.externalNats.monitoringEndpoint }}
{{- else }}
{{- fail "nats.enabled is false: set externalNats.monitoringEndpoint (host:port of nats-server's monitoring) for KEDA, or keda.enabled=false" }}
{{- end }}
{{- end }}

{{/* The work stream: fleetserve.queue.jetstream.StreamOptions.stream */}}
{{- define "fleetserve.stream" -}}
{{- printf "%s_WORK" (.Values.queue.prefix | upper | replace "." "_") }}
{{- end }}

{{/* A model id as one subject token: fleetserve.wire.headers.subject_token. Characters
other than A-Z a-z 0-9 and "-" become _XX (UTF-8 hex); the common ones are done here and
anything else fails rather than produce a consumer name the worker would not use. */}}
{{- define "fleetserve.token" -}}
{{- $t := . | replace "_" "_5F" | replace "/" "_2F" | replace "." "_2E" | replace ":" "_3A" | replace "@" "_40" | replace "+" "_2B" | replace " " "_20" }}
{{- if not (regexMatch "^[A-Za-z0-9_-]+$" $t) }}
{{- fail (printf "model id %q has characters the chart cannot turn into a consumer name; name the consumers of this pool's models in values (see docs/deploy.md)" .) }}
{{- end }}
{{- $t }}
{{- end }}

{{/* A model served on first use, as a --models entry: patterns pass; an id becomes the
one-character glob "[c]rest", which matches exactly it but is not loaded at start
(the worker loads the ids it is given at start, patterns on first use). */}}
{{- define "fleetserve.lazyModel" -}}
{{- if regexMatch "[*?\\[]" . }}
{{- . }}
{{- else }}
{{- printf "[%s]%s" (substr 0 1 .) (substr 1 (len .) .) }}
{{- end }}
{{- end }}

{{- define "fleetserve.isPattern" -}}
{{- if regexMatch "[*?\\[]" . }}true{{ end }}
{{- end }}

{{- define "fleetserve.image" -}}
{{- $tag := default .root.Chart.AppVersion .root.Values.image.tag }}
{{- if .variant }}{{ $tag = printf "%s-%s" $tag .variant }}{{ end }}
{{- printf "%s:%s" .root.Values.image.repository $tag }}
{{- end }}

{{/* Environment every fleetserve process gets. */}}
{{- define "fleetserve.env" -}}
- name: FLEETSERVE_NATS
  value: {{ include "fleetserve.natsUrl" . | quote }}
- name: FLEETSERVE_QUEUE_PREFIX
  value: {{ .Values.queue.prefix | quote }}
- name: FLEETSERVE_STREAM_STORAGE
  value: {{ .Values.queue.storage | quote }}
- name: FLEETSERVE_STREAM_REPLICAS
  value: {{ .Values.queue.replicas | default 1 | quote }}
- name: FLEETSERVE_HOST
  value: "0.0.0.0"
- name: FLEETSERVE_HF_CACHE
  value: {{ .Values.weights.hfCache | quote }}
- name: FLEETSERVE_CACHE_DIR
  value: /var/cache/fleetserve
{{- if .Values.catalog }}
- name: FLEETSERVE_CATALOG
  value: /etc/fleetserve/catalog
{{- end }}
{{- range $k, $v := .Values.settings }}
- name: {{ printf "FLEETSERVE_%s" ($k | upper) }}
  value: {{ $v | toString | quote }}
{{- end }}
{{- end }}

{{- define "fleetserve.volumeMounts" -}}
- name: tmp
  mountPath: /tmp
- name: home
  mountPath: /home/fleetserve
- name: cache
  mountPath: /var/cache/fleetserve
{{- if .Values.weights.volume }}
- name: models
  mountPath: /models
  readOnly: true
{{- end }}
{{- if .Values.catalog }}
- name: catalog
  mountPath: /etc/fleetserve/catalog
  readOnly: true
{{- end }}
{{- end }}

{{- define "fleetserve.volumes" -}}
- name: tmp
  emptyDir: {}
- name: home
  emptyDir: {}
- name: cache
  {{- toYaml .Values.cache.volume | nindent 2 }}
{{- if .Values.weights.volume }}
- name: models
  {{- toYaml .Values.weights.volume | nindent 2 }}
{{- end }}
{{- if .Values.catalog }}
- name: catalog
  configMap:
    name: {{ include "fleetserve.fullname" . }}-catalog
{{- end }}
{{- end }}
