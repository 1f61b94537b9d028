{{/* One worker pool, its device type's defaults filled in and checked, as YAML:
call with (dict "root" $ "pool" $p) and read it back with fromYaml. */}}
{{- define "fleetserve.pool" -}}
{{- $root := .root }}
{{- $p := .pool }}
{{- $device := default "cpu" $p.device }}
{{- $d := index $root.Values.devices $device | default dict }}
{{- $s := $p.scaling | default dict }}
{{- $pinned := $p.pinned | default list }}
{{- $models := $p.models | default list }}
{{- $min := int (ternary 1 $s.minReplicas (kindIs "invalid" $s.minReplicas)) }}
{{- range $pinned }}
{{- if include "fleetserve.isPattern" . }}
{{- fail (printf "workerPools[%s]: pinned %q is a pattern; pin model ids (patterns go in models, loaded on first use)" $p.name .) }}
{{- end }}
{{- end }}
{{- if and (eq $min 0) (gt (len $pinned) 0) }}
{{- fail (printf "workerPools[%s]: scale to zero (scaling.minReplicas 0) and pinned models (%s) cannot go together: pinned models are loaded at start to stay resident, and a pool scaled to zero holds none, so their first requests would wait for a cold start. Move them to models (loaded on first use) for a cold pool, or set scaling.minReplicas to 1 or more." $p.name (join ", " $pinned)) }}
{{- end }}
{{- $entries := list }}
{{- range $pinned }}{{ $entries = append $entries . }}{{ end }}
{{- range $models }}{{ $entries = append $entries (include "fleetserve.lazyModel" .) }}{{ end }}
{{- $args := list "worker" }}
{{- if $entries }}{{ $args = concat $args (list "--models" (join "," $entries)) }}{{ end }}
{{- if $p.devices }}
{{- $args = concat $args (list "--devices" $p.devices) }}
{{- else }}
{{- $args = concat $args (list "--device" (ternary "cuda" "cpu" (eq $device "cuda"))) }}
{{- end }}
{{- with $p.hardwareClass }}{{ $args = concat $args (list "--hardware-class" .) }}{{ end }}
{{- with $p.memoryBudget }}{{ $args = concat $args (list "--memory-budget" .) }}{{ end }}
{{- $args = concat $args (list "--worker-port" (toString (default 8081 $p.port))) }}
{{- $ids := list }}
{{- range $pinned }}{{ $ids = append $ids . }}{{ end }}
{{- range $models }}{{ if not (include "fleetserve.isPattern" .) }}{{ $ids = append $ids . }}{{ end }}{{ end }}
{{- $triggers := list }}
{{- range $m := uniq $ids }}
{{- $given := index ($s.lagThresholds | default dict) $m | default dict }}
{{- $tok := include "fleetserve.token" $m }}
{{- $triggers = append $triggers (dict "model" $m "class" "batch" "name" (include "fleetserve.triggerName" (list "batch" $m)) "consumer" (printf "w-%s" $tok) "lagThreshold" (int (default (default 500 $s.lagThreshold) $given.batch))) }}
{{- $triggers = append $triggers (dict "model" $m "class" "interactive" "name" (include "fleetserve.triggerName" (list "interactive" $m)) "consumer" (printf "wi-%s" $tok) "lagThreshold" (int (default (default 50 $s.interactiveLagThreshold) $given.interactive))) }}
{{- end }}
{{- $max := int (default 4 $s.maxReplicas) }}
{{- if lt $max $min }}
{{- fail (printf "workerPools[%s]: scaling.maxReplicas (%d) is below scaling.minReplicas (%d)" $p.name $max $min) }}
{{- end }}
{{- /* a key the pool sets wins even when it is 0, false, "" or empty: `default` would
treat those as unset */}}
{{- $pdb := $p.pdb | default dict }}
name: {{ printf "%s-worker-%s" (include "fleetserve.fullname" $root) $p.name | trunc 63 | trimSuffix "-" | quote }}
pool: {{ $p.name | quote }}
device: {{ $device }}
variant: {{ include "fleetserve.either" (list $p.imageVariant $d.imageVariant "") }}
port: {{ default 8081 $p.port }}
minReplicas: {{ $min }}
maxReplicas: {{ $max }}
replicas: {{ ternary (max 1 $min) $p.replicas (kindIs "invalid" $p.replicas) | int }}
scaling: {{ ternary false true (eq (toString $s.enabled) "false") }}
pdbEnabled: {{ ternary true $pdb.enabled (kindIs "invalid" $pdb.enabled) }}
pdbBudget: {{ include "fleetserve.pdbBudget" (dict "pdb" $pdb "where" (printf "workerPools[%s].pdb" $p.name) "default" (dict "maxUnavailable" 1)) | fromYaml | toJson }}
args: {{ toJson $args }}
nodeSelector: {{ include "fleetserve.either" (list $p.nodeSelector $d.nodeSelector dict) }}
tolerations: {{ include "fleetserve.either" (list $p.tolerations $d.tolerations list) }}
resources: {{ include "fleetserve.either" (list $p.resources $d.resources dict) }}
affinity: {{ toJson ($p.affinity | default dict) }}
triggers: {{ toJson $triggers }}
{{- end }}

{{/* (list given fallback last) -> JSON of the first that is set (not null), even when it
is "", 0, false or empty; `default` would skip those. */}}
{{- define "fleetserve.either" -}}
{{- $given := index . 0 }}{{ $fallback := index . 1 }}
{{- if not (kindIs "invalid" $given) }}{{ toJson $given }}
{{- else if not (kindIs "invalid" $fallback) }}{{ toJson $fallback }}
{{- else }}{{ toJson (index . 2) }}
{{- end }}
{{- end }}

{{/* A PodDisruptionBudget's budget as YAML: the pdb's minAvailable or maxUnavailable
(0 included), else the default; both at once is an error Kubernetes would reject. */}}
{{- define "fleetserve.pdbBudget" -}}
{{- $min := .pdb.minAvailable }}{{ $max := .pdb.maxUnavailable }}
{{- if and (not (kindIs "invalid" $min)) (not (kindIs "invalid" $max)) }}
{{- fail (printf "%s: set minAvailable or maxUnavailable, not both (set the other to null)" .where) }}
{{- else if not (kindIs "invalid" $min) }}
{{- toYaml (dict "minAvailable" $min) }}
{{- else if not (kindIs "invalid" $max) }}
{{- toYaml (dict "maxUnavailable" $max) }}
{{- else }}
{{- toYaml .default }}
{{- end }}
{{- end }}

{{/* A KEDA trigger's name, unique per model id and class and a DNS-1123 label: the
class, the id in lower case letters and digits (cut short), and 10 hex digits of the
sha256 of the exact id, so ids that share a long prefix or differ only in case differ. */}}
{{- define "fleetserve.triggerName" -}}
{{- $class := index . 0 }}{{ $id := index . 1 }}
{{- $slug := regexReplaceAll "[^a-z0-9]+" (lower $id) "-" | trunc 40 | trimAll "-" }}
{{- join "-" (compact (list $class $slug (sha256sum $id | trunc 10))) }}
{{- end }}
