{{/*
Full name: fullnameOverride, else "<release>-etcd-rendezvous", cut to 63 characters (a DNS
label). The chart name is spelled out rather than taken from .Chart.Name so the name is the
same when the chart is installed alone, as a dependency, or under an alias.
*/}}
{{- define "etcd-rendezvous.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-etcd-rendezvous" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/*
StatefulSet name: the full name cut to 52 characters, because the controller adds a
"controller-revision-hash" label of "<name>-<10 character hash>", and labels stop at 63.
*/}}
{{- define "etcd-rendezvous.statefulsetName" -}}
{{- include "etcd-rendezvous.fullname" . | trunc 52 | trimSuffix "-" -}}
{{- end -}}

{{/* The member name: the pod name of the single replica. */}}
{{- define "etcd-rendezvous.memberName" -}}
{{- printf "%s-0" (include "etcd-rendezvous.statefulsetName" .) -}}
{{- end -}}

{{- define "etcd-rendezvous.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Selector labels: name, instance and component only, never a version. */}}
{{- define "etcd-rendezvous.selectorLabels" -}}
app.kubernetes.io/name: etcd-rendezvous
app.kubernetes.io/instance: {{ .Release.Name | quote }}
app.kubernetes.io/component: rendezvous
{{- end -}}

{{- define "etcd-rendezvous.labels" -}}
{{ include "etcd-rendezvous.selectorLabels" . }}
app.kubernetes.io/part-of: elastic-job
app.kubernetes.io/managed-by: {{ .Release.Service | quote }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ include "etcd-rendezvous.chart" . | quote }}
{{- end -}}

{{- define "etcd-rendezvous.clientHost" -}}
{{- printf "%s.%s.svc.%s" (include "etcd-rendezvous.fullname" .) .Release.Namespace .Values.clusterDomain -}}
{{- end -}}

{{- define "etcd-rendezvous.scheme" -}}
{{- if .Values.tls.enabled }}https{{ else }}http{{ end -}}
{{- end -}}

{{/*
Render-time checks. The image tag must be a 3.5 release, 3.5.11 or later: /livez and
/readyz arrived in 3.5.11, and 3.6 removed the v2 API torch's etcd-v2 backend speaks.
A digest may follow the tag (v3.5.21@sha256:...).
*/}}
{{- define "etcd-rendezvous.validate" -}}
{{- $tag := .Values.image.tag | toString -}}
{{- $version := regexFind "^v?[0-9]+\\.[0-9]+\\.[0-9]+" $tag -}}
{{- if not $version -}}
{{- fail (printf "image.tag %q is not an etcd release tag (vMAJOR.MINOR.PATCH): pin a 3.5 release, 3.5.11 or later, e.g. v3.5.21" $tag) -}}
{{- end -}}
{{- $parts := splitList "." (trimPrefix "v" $version) -}}
{{- $major := index $parts 0 | atoi -}}
{{- $minor := index $parts 1 | atoi -}}
{{- $patch := index $parts 2 | atoi -}}
{{- if or (gt $major 3) (and (eq $major 3) (ge $minor 6)) -}}
{{- fail (printf "image.tag %q: etcd 3.6 and later removed the v2 API that torch's etcd-v2 rendezvous backend needs; pin a 3.5 release, 3.5.11 or later (e.g. v3.5.21)" $tag) -}}
{{- end -}}
{{- if or (lt $major 3) (and (eq $major 3) (lt $minor 5)) (and (eq $major 3) (eq $minor 5) (lt $patch 11)) -}}
{{- fail (printf "image.tag %q is older than 3.5.11, the first release with /livez and /readyz for the probes; pin a 3.5 release, 3.5.11 or later (e.g. v3.5.21)" $tag) -}}
{{- end -}}
{{- if and .Values.tls.enabled (not .Values.tls.existingSecret) -}}
{{- fail "tls.enabled is true but tls.existingSecret is empty: name a Secret holding tls.crt, tls.key and ca.crt" -}}
{{- end -}}
{{- if and .Values.tls.clientCertAuth (not .Values.tls.enabled) -}}
{{- fail "tls.clientCertAuth needs tls.enabled: true" -}}
{{- end -}}
{{- end -}}
