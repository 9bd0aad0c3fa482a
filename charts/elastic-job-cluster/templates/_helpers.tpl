{{/* Chart name, or nameOverride, cut to 63 characters. */}}
{{- define "elastic-job-cluster.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
Full name prefix of every object, cut to 63 characters: fullnameOverride, else the release
name when it contains the chart name, else "<release>-<chart name>".
*/}}
{{- define "elastic-job-cluster.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "elastic-job-cluster.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* All labels of a component's objects, global.commonLabels last (sorted). Call with (dict
"root" $ "component" "node-reader"). */}}
{{- define "elastic-job-cluster.labels" -}}
app.kubernetes.io/name: {{ include "elastic-job-cluster.name" .root | quote }}
app.kubernetes.io/instance: {{ .root.Release.Name | quote }}
app.kubernetes.io/component: {{ .component }}
app.kubernetes.io/part-of: elastic-job
app.kubernetes.io/managed-by: {{ .root.Release.Service | quote }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
helm.sh/chart: {{ include "elastic-job-cluster.chart" .root | quote }}
{{- include "elastic-job-cluster.commonLabels" . }}
{{- end -}}

{{/*
global.commonLabels as label lines, each after a newline, sorted. The chart's own label
keys may not be repeated (a duplicate key is invalid YAML). Twin of elastic-job.commonLabels
and etcd-rendezvous.commonLabels.
*/}}
{{- define "elastic-job-cluster.commonLabels" -}}
{{- $common := (.root.Values.global | default dict).commonLabels | default dict -}}
{{- range $key := keys $common | sortAlpha }}
{{- if or (hasPrefix "app.kubernetes.io/" $key) (eq $key "helm.sh/chart") }}
{{- fail (printf "global.commonLabels.%s: the chart sets this label itself; remove it from global.commonLabels (use another key)" $key) }}
{{- end }}
{{ $key }}: {{ index $common $key | toString | quote }}
{{- end }}
{{- end -}}

{{/* Object names, each cut so that it stays within 63 characters with its suffix; the
templates and NOTES.txt name objects only through these. */}}
{{- define "elastic-job-cluster.podMonitorName" -}}
{{- printf "%s-workers" (include "elastic-job-cluster.fullname" . | trunc 55 | trimSuffix "-") -}}
{{- end -}}

{{- define "elastic-job-cluster.prometheusRuleName" -}}
{{- include "elastic-job-cluster.fullname" . -}}
{{- end -}}

{{- define "elastic-job-cluster.dashboardName" -}}
{{- printf "%s-dashboard" (include "elastic-job-cluster.fullname" . | trunc 53 | trimSuffix "-") -}}
{{- end -}}

{{/* The node reader's ClusterRole and ClusterRoleBinding (one name for both). */}}
{{- define "elastic-job-cluster.nodeReaderName" -}}
{{- printf "%s-node-reader" (include "elastic-job-cluster.fullname" . | trunc 51 | trimSuffix "-") -}}
{{- end -}}

{{/*
The node reader's subjects as a JSON list (empty: nothing to bind): the Group
system:serviceaccounts with nodeReader.allServiceAccounts, else one Group
system:serviceaccounts:<namespace> per namespace set true, sorted.
*/}}
{{- define "elastic-job-cluster.nodeReaderSubjects" -}}
{{- $r := .Values.nodeReader -}}
{{- $subjects := list -}}
{{- if $r.allServiceAccounts -}}
{{- $subjects = append $subjects (dict "apiGroup" "rbac.authorization.k8s.io" "kind" "Group" "name" "system:serviceaccounts") -}}
{{- else -}}
{{- range $ns := include "elastic-job-cluster.chosen" $r.namespaces | fromJsonArray -}}
{{- $subjects = append $subjects (dict "apiGroup" "rbac.authorization.k8s.io" "kind" "Group" "name" (printf "system:serviceaccounts:%s" $ns)) -}}
{{- end -}}
{{- end -}}
{{- toJson $subjects -}}
{{- end -}}

{{/* Namespaces set true in a map of namespace -> bool, sorted, as a JSON list. */}}
{{- define "elastic-job-cluster.chosen" -}}
{{- $out := list -}}
{{- range $ns := keys . | sortAlpha -}}
{{- if index $ $ns -}}
{{- $out = append $out $ns -}}
{{- end -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}
