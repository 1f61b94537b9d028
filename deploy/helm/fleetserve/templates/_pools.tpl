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
{{- $triggers = append $triggers (dict "model" $m "class" "batch" "consumer" (printf "w-%s" $tok) "lagThreshold" (int (default (default 500 $s.lagThreshold) $given.batch))) }}
{{- $triggers = append $triggers (dict "model" $m "class" "interactive" "consumer" (printf "wi-%s" $tok) "lagThreshold" (int (default (default 50 $s.interactiveLagThreshold) $given.interactive))) }}
{{- end }}
name: {{ printf "%s-worker-%s" (include "fleetserve.fullname" $root) $p.name | trunc 63 | trimSuffix "-" | quote }}
pool: {{ $p.name | quote }}
device: {{ $device }}
variant: {{ default $d.imageVariant $p.imageVariant | default "" | quote }}
port: {{ default 8081 $p.port }}
minReplicas: {{ $min }}
maxReplicas: {{ int (default 4 $s.maxReplicas) }}
scaling: {{ ternary false true (eq (toString $s.enabled) "false") }}
args: {{ toJson $args }}
nodeSelector: {{ toJson (default $d.nodeSelector $p.nodeSelector | default dict) }}
tolerations: {{ toJson (default $d.tolerations $p.tolerations | default list) }}
resources: {{ toJson (default $d.resources $p.resources | default dict) }}
affinity: {{ toJson ($p.affinity | default dict) }}
triggers: {{ toJson $triggers }}
{{- end }}
