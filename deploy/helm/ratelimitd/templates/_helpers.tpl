{{/* The name of every object of a release, within the 63 characters of a DNS label. */}}
{{- define "ratelimitd.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* The labels that select the release's pods; they never change after install. */}}
{{- define "ratelimitd.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The labels of every object: the selector labels, the chart and the version. */}}
{{- define "ratelimitd.labels" -}}
{{ include "ratelimitd.selectorLabels" . }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/*
The source of a URL setting (database or redis): "inline" when the chart
keeps the URL in its own Secret, "secret" for an existing Secret, "" for
none. Both at once is refused, so that no value is silently ignored.
*/}}
{{- define "ratelimitd.urlSource" -}}
{{- $v := index .root.Values .name -}}
{{- if and $v.url $v.existingSecret.name -}}
{{- fail (printf "%s: give %s.url or %s.existingSecret.name, not both" .name .name .name) -}}
{{- else if $v.url -}}
inline
{{- else if $v.existingSecret.name -}}
secret
{{- end -}}
{{- end -}}

{{/* An env entry for a URL setting read from a Secret, or nothing. */}}
{{- define "ratelimitd.urlEnv" -}}
{{- $v := index .root.Values .name -}}
{{- $source := include "ratelimitd.urlSource" . -}}
{{- if $source -}}
- name: {{ .env }}
  valueFrom:
    secretKeyRef:
      {{- if eq $source "inline" }}
      name: {{ include "ratelimitd.fullname" .root }}
      key: {{ .name }}-url
      {{- else }}
      name: {{ $v.existingSecret.name }}
      key: {{ $v.existingSecret.key }}
      {{- end }}
{{- end }}
{{- end -}}

{{/*
checks refuses values that would deploy something that does not work as
the values suggest.
*/}}
{{- define "ratelimitd.checks" -}}
{{- $db := include "ratelimitd.urlSource" (dict "root" . "name" "database") -}}
{{- $redis := include "ratelimitd.urlSource" (dict "root" . "name" "redis") -}}
{{- if and (gt (int .Values.replicaCount) 1) (not $db) -}}
{{- fail "replicaCount: more than one replica needs Postgres (database.url or database.existingSecret.name); SQLite on an emptyDir is one pod's own" -}}
{{- end -}}
{{- if and (gt (int .Values.replicaCount) 1) (not $redis) -}}
{{- fail "replicaCount: more than one replica needs Redis (redis.url or redis.existingSecret.name); with buckets in each pod, N replicas admit N times every limit" -}}
{{- end -}}
{{- range $name, $_ := .Values.env -}}
{{- if has $name (list "RATELIMIT_HTTP_ADDR" "RATELIMIT_GRPC_ADDR" "RATELIMIT_DATABASE_URL" "RATELIMIT_REDIS_URL" "RATELIMIT_BOOTSTRAP_TOKEN") -}}
{{- fail (printf "env.%s: set by the chart; use the ports, database, redis or bootstrapToken values" $name) -}}
{{- end -}}
{{- end -}}
{{- with .Values.podDisruptionBudget -}}
{{- if and .enabled (eq (kindIs "invalid" .minAvailable) (kindIs "invalid" .maxUnavailable)) -}}
{{- fail "podDisruptionBudget: give exactly one of minAvailable and maxUnavailable" -}}
{{- end -}}
{{- end -}}
{{- end -}}
