{{/*
Chart name in object names: nameOverride, else "etcd-rendezvous". Spelled out rather than
taken from .Chart.Name so the name is the same when the chart is installed alone, as a
dependency, or under an alias.
*/}}
{{- define "etcd-rendezvous.name" -}}
{{- .Values.nameOverride | default "etcd-rendezvous" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
Full name: fullnameOverride, else "<release>-<name>", cut to 63 characters (a DNS label).
A parent chart (elastic-job) calls this and the other name helpers below with a context
it builds (Values, Chart, Release): they read nothing else.
*/}}
{{- define "etcd-rendezvous.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "etcd-rendezvous.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/*
StatefulSet name: the full name cut to 52 characters, because the controller adds a
"controller-revision-hash" label of "<name>-<10 character hash>", and labels stop at 63.
*/}}
{{- define "etcd-rendezvous.statefulsetName" -}}
{{- include "etcd-rendezvous.fullname" . | trunc 52 | trimSuffix "-" -}}
{{- end -}}

{{/* The headless Service: "<fullname>-headless", the full name cut so it stays within 63. */}}
{{- define "etcd-rendezvous.headlessName" -}}
{{- printf "%s-headless" (include "etcd-rendezvous.fullname" . | trunc 54 | trimSuffix "-") -}}
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

{{/* All labels of the chart's objects. A pod template passes (dict "Values" "Release" "Chart"
"except" <podLabels>) so that its own podLabels win over global.commonLabels. */}}
{{- define "etcd-rendezvous.labels" -}}
{{ include "etcd-rendezvous.selectorLabels" . }}
app.kubernetes.io/part-of: elastic-job
app.kubernetes.io/managed-by: {{ .Release.Service | quote }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ include "etcd-rendezvous.chart" . | quote }}
{{- include "etcd-rendezvous.commonLabels" (dict "Values" .Values "except" .except) }}
{{- end -}}

{{/*
global.commonLabels as label lines, each after a newline, sorted; keys in .except (a pod's
own podLabels, which win) are left out. The same rule as elastic-job's twin helper: the
charts' own label keys may not be repeated, nor Kueue's (a queue label on every object
would have Kueue gate the etcd pod too).
*/}}
{{- define "etcd-rendezvous.commonLabels" -}}
{{- $common := (.Values.global | default dict).commonLabels | default dict -}}
{{- $except := .except | default dict -}}
{{- range $key := keys $common | sortAlpha }}
{{- if or (hasPrefix "app.kubernetes.io/" $key) (eq $key "helm.sh/chart") (hasPrefix "elastic-job.pytorch.org/" $key) (hasPrefix "kueue.x-k8s.io/" $key) }}
{{- fail (printf "global.commonLabels.%s: the charts set this label themselves; remove it from global.commonLabels (use another key)" $key) }}
{{- end }}
{{- if not (hasKey $except $key) }}
{{ $key }}: {{ index $common $key | toString | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{/*
The etcd image reference: global.imageRegistry replaces the repository's registry host
(or prefixes a repository without one), then ":tag", then "@digest" when image.digest is
set (the tag is kept: the chart checks it names a 3.5 release). Twin of elastic-job.image.
*/}}
{{- define "etcd-rendezvous.image" -}}
{{- $repo := .Values.image.repository -}}
{{- $registry := (.Values.global | default dict).imageRegistry | default "" | trimSuffix "/" -}}
{{- if $registry -}}
{{- $parts := splitList "/" $repo -}}
{{- if and (gt (len $parts) 1) (regexMatch "[.:]|^localhost$" (first $parts)) -}}
{{- $repo = join "/" (rest $parts) -}}
{{- end -}}
{{- $repo = printf "%s/%s" $registry $repo -}}
{{- end -}}
{{- $ref := printf "%s:%s" $repo (.Values.image.tag | toString) -}}
{{- with .Values.image.digest }}{{ $ref = printf "%s@%s" $ref . }}{{ end -}}
{{- $ref -}}
{{- end -}}

{{/* imagePullSecrets entries, from names or {name: ...} objects. Twin of elastic-job's. */}}
{{- define "etcd-rendezvous.imagePullSecrets" -}}
{{- range . }}
{{- if kindIs "map" . }}
- name: {{ .name | quote }}
{{- else }}
- name: {{ . | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{/* A size as Kubernetes reads it: YAML integers in full (2147483648, which Helm holds as
2.147483648e+09), strings as written. */}}
{{- define "etcd-rendezvous.quantity" -}}
{{- if and (kindIs "float64" .) (eq . (float64 (int64 .))) -}}
{{- int64 . -}}
{{- else -}}
{{- toString . -}}
{{- end -}}
{{- end -}}

{{- define "etcd-rendezvous.clusterDomain" -}}
{{- .Values.clusterDomain | default ((.Values.global | default dict).clusterDomain) | default "cluster.local" -}}
{{- end -}}

{{- define "etcd-rendezvous.clientHost" -}}
{{- printf "%s.%s.svc.%s" (include "etcd-rendezvous.fullname" .) .Release.Namespace (include "etcd-rendezvous.clusterDomain" .) -}}
{{- end -}}

{{/* The client port (Services, container, flags, NetworkPolicy). */}}
{{- define "etcd-rendezvous.clientPort" -}}
2379
{{- end -}}

{{/* host:port of the client Service, as clients (torch, elastic-worker) are given it. */}}
{{- define "etcd-rendezvous.clientEndpoint" -}}
{{- printf "%s:%s" (include "etcd-rendezvous.clientHost" .) (include "etcd-rendezvous.clientPort" .) -}}
{{- end -}}

{{/* The Secret with the server certificate (tls.crt, tls.key, ca.crt). */}}
{{- define "etcd-rendezvous.serverSecret" -}}
{{- .Values.tls.existingSecret | default (printf "%s-server-tls" (include "etcd-rendezvous.fullname" .)) -}}
{{- end -}}

{{/* The Secret cert-manager writes the workers' client certificate to. */}}
{{- define "etcd-rendezvous.clientSecret" -}}
{{- printf "%s-client-tls" (include "etcd-rendezvous.fullname" .) -}}
{{- end -}}

{{/* The clients' rendezvous backend (global.rendezvousBackend): etcd-v2, etcd-v3 or etcd-lease
(both of the latter speak the v3 API only). */}}
{{- define "etcd-rendezvous.backend" -}}
{{- (.Values.global | default dict).rendezvousBackend | default "etcd-v2" -}}
{{- end -}}

{{- define "etcd-rendezvous.scheme" -}}
{{- if .Values.tls.enabled }}https{{ else }}http{{ end -}}
{{- end -}}

{{/*
Render-time checks. The image tag must be 3.5.11 or later: /livez and /readyz arrived in
3.5.11. With the etcd-v2 backend it must be a 3.5 release: 3.6 removed the v2 API torch's
etcd-v2 backend speaks. With etcd-v3 or etcd-lease 3.6 is accepted too; a later minor is
not (untested).
A digest may follow the tag (vX.Y.Z@sha256:...).
*/}}
{{/* The tags the messages suggest: the 3.5 one is values.yaml's image.tag, the 3.6 one the
tag ci/etcd-v3-values.yaml installs (tests/charts/test_bad_values.py holds both to those). */}}
{{- define "etcd-rendezvous.suggestedTag35" -}}v3.5.33{{- end -}}
{{- define "etcd-rendezvous.suggestedTag36" -}}v3.6.14{{- end -}}

{{- define "etcd-rendezvous.validate" -}}
{{- /* As a dependency the user sets these under the chart's name: say so in messages. */ -}}
{{- $at := ternary "" (printf "%s." .Chart.Name) .Chart.IsRoot -}}
{{- $tag35 := include "etcd-rendezvous.suggestedTag35" . -}}
{{- $tag := .Values.image.tag | toString -}}
{{- $version := regexFind "^v?[0-9]+\\.[0-9]+\\.[0-9]+" $tag -}}
{{- if not $version -}}
{{- fail (printf "%simage.tag %q is not an etcd release tag (vMAJOR.MINOR.PATCH): pin a 3.5 release, 3.5.11 or later, e.g. %s" $at $tag $tag35) -}}
{{- end -}}
{{- $parts := splitList "." (trimPrefix "v" $version) -}}
{{- $major := index $parts 0 | atoi -}}
{{- $minor := index $parts 1 | atoi -}}
{{- $patch := index $parts 2 | atoi -}}
{{- $backend := include "etcd-rendezvous.backend" . -}}
{{- if ne $backend "etcd-v2" -}}
{{- if or (gt $major 3) (and (eq $major 3) (ge $minor 7)) -}}
{{- fail (printf "%simage.tag %q: the chart supports etcd 3.5 (3.5.11 or later) and 3.6; pin one of those (e.g. %s)" $at $tag (include "etcd-rendezvous.suggestedTag36" .)) -}}
{{- end -}}
{{- else if or (gt $major 3) (and (eq $major 3) (ge $minor 6)) -}}
{{- fail (printf "%simage.tag %q: etcd 3.6 and later removed the v2 API that torch's etcd-v2 rendezvous backend needs; pin a 3.5 release, 3.5.11 or later (e.g. %s), or set global.rendezvousBackend=etcd-v3" $at $tag $tag35) -}}
{{- end -}}
{{- if or (lt $major 3) (and (eq $major 3) (lt $minor 5)) (and (eq $major 3) (eq $minor 5) (lt $patch 11)) -}}
{{- fail (printf "%simage.tag %q is older than 3.5.11, the first release with /livez and /readyz for the probes; pin a 3.5 release, 3.5.11 or later (e.g. %s)" $at $tag $tag35) -}}
{{- end -}}
{{- if and .Values.image.digest (contains "@" $tag) -}}
{{- fail (printf "%simage.tag %q already holds a digest and %simage.digest is set too: keep one (image.digest, with the plain tag)" $at $tag $at) -}}
{{- end -}}
{{- if and .Values.tls.enabled (not .Values.tls.existingSecret) (not .Values.tls.certManager.enabled) -}}
{{- fail (printf "%stls.enabled is true but %stls.existingSecret is empty: name a Secret holding tls.crt, tls.key and ca.crt, or set %stls.certManager.enabled" $at $at $at) -}}
{{- end -}}
{{- if and .Values.tls.certManager.enabled (not .Values.tls.enabled) -}}
{{- fail (printf "%stls.certManager.enabled needs %stls.enabled: true" $at $at) -}}
{{- end -}}
{{- if and .Values.tls.certManager.enabled (not .Values.tls.certManager.issuerRef.name) -}}
{{- fail (printf "%stls.certManager.issuerRef.name is empty: name the cert-manager Issuer or ClusterIssuer that signs the etcd certificates" $at) -}}
{{- end -}}
{{- if and .Values.tls.clientCertAuth (not .Values.tls.enabled) -}}
{{- fail (printf "%stls.clientCertAuth needs %stls.enabled: true" $at $at) -}}
{{- end -}}
{{- end -}}

{{/*
The one place for the reasons of the checkov checks that the etcd StatefulSet fails on
purpose, and the ones it fails in this configuration, as its checkov.io/skipN
annotations. tests/charts/test_checkov.py scans the renders again without them and
compares: a skip whose finding is gone fails that test.
*/}}
{{- define "etcd-rendezvous.checkovSkips" -}}
{{- $reasons := dict
  "CKV_K8S_43" "the image is pulled by tag (image.tag); set image.digest to pin it"
  "CKV_K8S_15" "the image is pulled by tag with IfNotPresent, so a restart needs no registry; image.digest or image.pullPolicy Always passes"
  "CKV_K8S_11" "a CPU limit throttles etcd's heartbeats under load; requests are set, resources.limits.cpu is the user's choice"
  "CKV_K8S_13" "a memory limit that is hit kills the rendezvous mid-training; requests are set, resources.limits.memory is the user's choice"
  "CKV_K8S_116" "client TLS is optional (tls.enabled); the NetworkPolicy admits only the job's workers to the client port"
  "CKV_K8S_117" "client certificates are optional (tls.clientCertAuth); the NetworkPolicy admits only the job's workers to the client port"
  "CKV_K8S_119" "one member: the peer URL listens on the pod's loopback only, so there is no peer traffic to encrypt"
  "CKV2_K8S_6" "networkPolicy.enabled was turned off by the user (a CNI without NetworkPolicy, or the cluster's own policies)" -}}
{{- $ids := list -}}
{{- if not .Values.image.digest -}}
{{- $ids = append $ids "CKV_K8S_43" -}}
{{- if ne .Values.image.pullPolicy "Always" }}{{ $ids = append $ids "CKV_K8S_15" }}{{ end -}}
{{- end -}}
{{- $limits := (.Values.resources | default dict).limits | default dict -}}
{{- if not $limits.cpu }}{{ $ids = append $ids "CKV_K8S_11" }}{{ end -}}
{{- if not $limits.memory }}{{ $ids = append $ids "CKV_K8S_13" }}{{ end -}}
{{- if not .Values.tls.enabled }}{{ $ids = append $ids "CKV_K8S_116" }}{{ end -}}
{{- if not .Values.tls.clientCertAuth }}{{ $ids = append $ids "CKV_K8S_117" }}{{ end -}}
{{- $ids = append $ids "CKV_K8S_119" -}}
{{- if not .Values.networkPolicy.enabled }}{{ $ids = append $ids "CKV2_K8S_6" }}{{ end -}}
{{- range $i, $id := $ids }}
{{- $reason := index $reasons $id | required (printf "chart bug: %s has no reason in etcd-rendezvous.checkovSkips" $id) }}
checkov.io/skip{{ add1 $i }}: {{ printf "%s=%s" $id $reason | quote }}
{{- end -}}
{{- end -}}
