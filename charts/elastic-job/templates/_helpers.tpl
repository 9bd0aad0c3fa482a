{{/* Chart name, or nameOverride, cut to 63 characters. */}}
{{- define "elastic-job.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
Full name prefix of every object, cut to 63 characters (a DNS label): fullnameOverride,
else the release name when it contains the chart name, else "<release>-<chart name>".
*/}}
{{- define "elastic-job.fullname" -}}
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

{{- define "elastic-job.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Selector labels of a component: name, instance and component only, never a version. */}}
{{- define "elastic-job.selectorLabels" -}}
app.kubernetes.io/name: {{ include "elastic-job.name" .root | quote }}
app.kubernetes.io/instance: {{ .root.Release.Name | quote }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* All labels of a component's objects, global.commonLabels last. Call with (dict "root" $
"component" "worker"), and "except" <podLabels> in a pod template (its podLabels win). */}}
{{- define "elastic-job.labels" -}}
{{ include "elastic-job.selectorLabels" . }}
app.kubernetes.io/part-of: elastic-job
app.kubernetes.io/managed-by: {{ .root.Release.Service | quote }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
helm.sh/chart: {{ include "elastic-job.chart" .root | quote }}
{{- include "elastic-job.commonLabels" . }}
{{- end -}}

{{/*
global.commonLabels as label lines, each after a newline, sorted; keys in .except are left
out. The charts' own label keys may not be repeated (a duplicate key is invalid YAML, and a
changed selector label would orphan pods). Twin of etcd-rendezvous.commonLabels.
*/}}
{{- define "elastic-job.commonLabels" -}}
{{- $common := (.root.Values.global | default dict).commonLabels | default dict -}}
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
Job id (torch --rdzv-id): job.id, else "<namespace>-<release>"; lower-cased, cut to 63
characters, trailing "-" removed. Stable: never random.
*/}}
{{- define "elastic-job.jobId" -}}
{{- $id := .Values.job.id | default (printf "%s-%s" .Release.Namespace .Release.Name) -}}
{{- $id | lower | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The worker StatefulSet of a group: "<fullname>-<group>", at most 52 characters (the
controller-revision-hash label adds "-<10 character hash>" and labels stop at 63). The full
name is cut, never the group, so a long release name keeps groups apart and apart from the
etcd StatefulSet ("<release>-etcd-rendezvous"); _validate.tpl refuses what still collides. */}}
{{- define "elastic-job.statefulsetName" -}}
{{- $prefix := include "elastic-job.fullname" .root | trunc (int (sub 51 (len .group))) | trimSuffix "-" -}}
{{- printf "%s-%s" $prefix .group -}}
{{- end -}}

{{/* The names of every worker StatefulSet of this release, one a line, sorted by group:
callers `trim` and split on "\n". Written out, not appended to a list (a sprig append
copies the list: N groups would cost N squared). */}}
{{- define "elastic-job.statefulsetNames" -}}
{{- range $group, $g := .Values.workerGroups }}
{{- if $g }}
{{ include "elastic-job.statefulsetName" (dict "root" $ "group" $group) }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The ConfigMap that lists the worker StatefulSets for the worker (worker-configmap.yaml). */}}
{{- define "elastic-job.statefulsetsConfigMapName" -}}
{{- printf "%s-statefulsets" (include "elastic-job.fullname" .) -}}
{{- end -}}

{{/* The one headless Service of the workers (stable pod DNS names). */}}
{{- define "elastic-job.workerServiceName" -}}
{{- printf "%s-workers" (include "elastic-job.fullname" . | trunc 55 | trimSuffix "-") -}}
{{- end -}}

{{- define "elastic-job.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "elastic-job.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/*
"true" when a finished job scales its StatefulSets to zero: rbac.scaleDown.enabled, a
ServiceAccount the Role is bound to, and its token mounted; else "". Only then does the
worker container see the token.
*/}}
{{- define "elastic-job.scaleDown" -}}
{{- $v := .Values -}}
{{- if and $v.rbac.scaleDown.enabled (or $v.serviceAccount.create $v.serviceAccount.name) $v.worker.automountServiceAccountToken -}}
true
{{- end -}}
{{- end -}}

{{/*
"true" when the workers record Events: events.enabled, a ServiceAccount the Role is bound
to, and its token mounted; else "".
*/}}
{{- define "elastic-job.events" -}}
{{- $v := .Values -}}
{{- if and $v.events.enabled (or $v.serviceAccount.create $v.serviceAccount.name) $v.worker.automountServiceAccountToken -}}
true
{{- end -}}
{{- end -}}

{{/*
"true" when the workers reclaim a dead node's pod slot (nodeLoss.reclaim.enabled, with a
ServiceAccount the Role is bound to and its token mounted; _validate.tpl refuses it
without) and there is a pod to name; else "". Never a Role without pod names: an empty
resourceNames would grant every pod of the namespace.
*/}}
{{- define "elastic-job.reclaim" -}}
{{- $v := .Values -}}
{{- if and $v.nodeLoss.reclaim.enabled (or $v.serviceAccount.create $v.serviceAccount.name) $v.worker.automountServiceAccountToken (include "elastic-job.podNames" . | trim) -}}
true
{{- end -}}
{{- end -}}

{{/*
Every worker pod name the chart's replicas make, one a line: each group's StatefulSet name
and its ordinals 0 to replicas - 1. Linear in the pods (the reclaim Role's resourceNames).
*/}}
{{- define "elastic-job.podNames" -}}
{{- range $group, $g := .Values.workerGroups }}
{{- if $g }}
{{- $sts := include "elastic-job.statefulsetName" (dict "root" $ "group" $group) }}
{{- range $i := until ($g.replicas | int) }}
{{ printf "%s-%d" $sts $i }}
{{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{/*
A group's tolerations with those of nodeLoss: node.kubernetes.io/not-ready and unreachable,
NoExecute, for nodeLoss.*TolerationSeconds (null: no limit), unless the list tolerates
that taint already (the same key or none, NoExecute or every effect: the rule of
Kubernetes' DefaultTolerationSeconds admission, which would add its 300 s otherwise).
Call with (dict "root" $ "tolerations" <list>); returns the list as YAML.
*/}}
{{- define "elastic-job.nodeLossTolerations" -}}
{{- $out := .tolerations | default list -}}
{{- $nl := .root.Values.nodeLoss -}}
{{- range $key, $seconds := dict "node.kubernetes.io/not-ready" $nl.notReadyTolerationSeconds "node.kubernetes.io/unreachable" $nl.unreachableTolerationSeconds -}}
{{- $covered := false -}}
{{- range $t := $out -}}
{{- if and (has ($t.key | default "") (list "" $key)) (has ($t.effect | default "") (list "" "NoExecute")) -}}
{{- $covered = true -}}
{{- end -}}
{{- end -}}
{{- if not $covered -}}
{{- $t := dict "key" $key "operator" "Exists" "effect" "NoExecute" -}}
{{- if not (kindIs "invalid" $seconds) -}}
{{- $_ := set $t "tolerationSeconds" ($seconds | int64) -}}
{{- end -}}
{{- $out = append $out $t -}}
{{- end -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}

{{/* The LocalQueue the worker StatefulSets go to: gang.kueue.queueName, else the one the
chart creates (gang.kueue.localQueue.create), named like the release. */}}
{{- define "elastic-job.kueueQueueName" -}}
{{- .Values.gang.kueue.queueName | default (include "elastic-job.fullname" .) -}}
{{- end -}}

{{- define "elastic-job.podGroupName" -}}
{{- include "elastic-job.fullname" . -}}
{{- end -}}

{{/* A number as Kubernetes and the entrypoints read it: integers without a decimal point. */}}
{{- define "elastic-job.num" -}}
{{- if eq (float64 .) (float64 (int64 .)) -}}
{{- int64 . -}}
{{- else -}}
{{- float64 . -}}
{{- end -}}
{{- end -}}

{{/* A value as a string, numbers written in full (1000000, not YAML-parsed 1e+06). */}}
{{- define "elastic-job.str" -}}
{{- if or (kindIs "float64" .) (kindIs "int64" .) (kindIs "int" .) -}}
{{- include "elastic-job.num" . -}}
{{- else -}}
{{- toString . -}}
{{- end -}}
{{- end -}}

{{/*
An image reference: global.imageRegistry replaces the repository's registry host (the
first path part when it has a "." or ":" or is "localhost"), or prefixes a repository
without one; then ":tag" (default the appVersion); then "@digest" when .image.digest is
set: pulled by digest, the tag kept for readers. Twin of etcd-rendezvous.image.
*/}}
{{- define "elastic-job.image" -}}
{{- $repo := .image.repository -}}
{{- $registry := (.root.Values.global | default dict).imageRegistry | default "" | trimSuffix "/" -}}
{{- if $registry -}}
{{- $parts := splitList "/" $repo -}}
{{- if and (gt (len $parts) 1) (regexMatch "[.:]|^localhost$" (first $parts)) -}}
{{- $repo = join "/" (rest $parts) -}}
{{- end -}}
{{- $repo = printf "%s/%s" $registry $repo -}}
{{- end -}}
{{- $ref := printf "%s:%s" $repo (.image.tag | default .root.Chart.AppVersion | toString) -}}
{{- with .image.digest }}{{ $ref = printf "%s@%s" $ref . }}{{ end -}}
{{- $ref -}}
{{- end -}}

{{/* imagePullSecrets entries from names or {name: ...} objects (worker.imagePullSecrets). */}}
{{- define "elastic-job.imagePullSecrets" -}}
{{- range . }}
{{- if kindIs "map" . }}
- name: {{ .name | quote }}
{{- else }}
- name: {{ . | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{/*
A group's effective settings over the worker defaults, as YAML. Call with
(dict "root" $ "name" <group> "group" <group values>). nodeSelector, env, podLabels and
podAnnotations merge (the group wins); the rest (tolerations, affinity,
topologySpreadConstraints, resources, gpus, priorityClassName) replace when the group sets them.
*/}}
{{- define "elastic-job.groupSettings" -}}
{{- $w := .root.Values.worker -}}
{{- $g := .group -}}
{{- $out := dict "replicas" $g.replicas -}}
{{- $_ := set $out "nodeSelector" (merge (deepCopy ($g.nodeSelector | default dict)) ($w.nodeSelector | default dict)) -}}
{{- $_ := set $out "env" (merge (deepCopy ($g.env | default dict)) ($w.env | default dict)) -}}
{{- $_ := set $out "podLabels" (merge (deepCopy ($g.podLabels | default dict)) ($w.podLabels | default dict)) -}}
{{- $_ := set $out "podAnnotations" (merge (deepCopy ($g.podAnnotations | default dict)) ($w.podAnnotations | default dict)) -}}
{{- range $key := list "tolerations" "affinity" "topologySpreadConstraints" "resources" "gpus" "priorityClassName" -}}
{{- if hasKey $g $key -}}
{{- $_ := set $out $key (index $g $key) -}}
{{- else -}}
{{- $_ := set $out $key (index $w $key) -}}
{{- end -}}
{{- end -}}
{{- $_ := set $out "tolerations" (include "elastic-job.nodeLossTolerations" (dict "root" .root "tolerations" $out.tolerations) | fromYamlArray) -}}
{{- toYaml $out -}}
{{- end -}}

{{/*
A group's topologySpreadConstraints as rendered. A constraint without a labelSelector
counts no pod, so it would spread nothing: it gets the group's StatefulSet selector, as
kube-scheduler's own default constraints are given their pod's workload's. Keys its
matchLabelKeys name are left to them (the API refuses a key in both; the pod's own label
selects the same). Call with (dict "root" $ "group" <name> "constraints" <list>).
*/}}
{{- define "elastic-job.topologySpreadConstraints" -}}
{{- $selector := include "elastic-job.selectorLabels" (dict "root" .root "component" "worker") | fromYaml -}}
{{- $_ := set $selector "elastic-job.pytorch.org/group" .group -}}
{{- $out := list -}}
{{- range $c := .constraints -}}
{{- $c = deepCopy $c -}}
{{- if kindIs "invalid" $c.labelSelector -}}
{{- $matchLabels := deepCopy $selector -}}
{{- range $key := $c.matchLabelKeys | default list -}}
{{- $_ := unset $matchLabels $key -}}
{{- end -}}
{{- $_ := set $c "labelSelector" (dict "matchLabels" $matchLabels) -}}
{{- end -}}
{{- $out = append $out $c -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}

{{/* Where the kubelet mounts a pod's ServiceAccount token. */}}
{{- define "elastic-job.tokenDir" -}}
/var/run/secrets/kubernetes.io/serviceaccount
{{- end -}}

{{/*
"true" when an extra container of the worker pods gets the empty volume over the token's
path: the pod mounts the token, the container is not in worker.extraContainersWithToken,
and it mounts nothing there itself (the API refuses two mounts at one path). Call with
(dict "root" $ "container" <Container>).
*/}}
{{- define "elastic-job.sidecarHidesToken" -}}
{{- $w := .root.Values.worker -}}
{{- $dir := include "elastic-job.tokenDir" . -}}
{{- $own := false -}}
{{- range $m := .container.volumeMounts | default list }}{{ if eq (trimSuffix "/" $m.mountPath) $dir }}{{ $own = true }}{{ end }}{{ end -}}
{{- if and $w.automountServiceAccountToken (not (has .container.name ($w.extraContainersWithToken | default list))) (not $own) -}}
true
{{- end -}}
{{- end -}}

{{/*
worker.extraInitContainers or worker.extraContainers as rendered: each container that
does not see the token (elastic-job.sidecarHidesToken) gets the no-api-token volume over
its path. Call with (dict "root" $ "containers" <list>).
*/}}
{{- define "elastic-job.extraContainers" -}}
{{- $root := .root -}}
{{- $out := list -}}
{{- range $c := .containers -}}
{{- if include "elastic-job.sidecarHidesToken" (dict "root" $root "container" $c) -}}
{{- $c = deepCopy $c -}}
{{- $mount := dict "name" "no-api-token" "mountPath" (include "elastic-job.tokenDir" $root) "readOnly" true -}}
{{- $_ := set $c "volumeMounts" (append ($c.volumeMounts | default list) $mount) -}}
{{- end -}}
{{- $out = append $out $c -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}

{{/* The worker container's resources: the group's, with its GPUs added to requests and limits. */}}
{{- define "elastic-job.workerResources" -}}
{{- $res := deepCopy (.settings.resources | default dict) -}}
{{- $gpus := .settings.gpus | default 0 | int64 -}}
{{- if gt $gpus 0 -}}
{{- $limits := $res.limits | default dict -}}
{{- $_ := set $limits .root.Values.worker.gpuResourceName $gpus -}}
{{- $_ := set $res "limits" $limits -}}
{{- $requests := $res.requests | default dict -}}
{{- $_ := set $requests .root.Values.worker.gpuResourceName $gpus -}}
{{- $_ := set $res "requests" $requests -}}
{{- end -}}
{{- toYaml $res -}}
{{- end -}}

{{/*
The one place for the reasons of the checkov checks that the chart's pods fail on purpose.
A pod template carries `checkov.io/skipN: <check>=<reason>` annotations only for the
checks it fails in that configuration: tests/charts/test_checkov.py scans the renders
again without them and compares (a skip whose finding is gone fails that test).
*/}}
{{- define "elastic-job.checkovReasons" -}}
CKV_K8S_43: "the chart cannot know the digest of the image a user builds or mirrors, so images are pulled by tag until the user sets worker.image.digest, initTopology.image.digest, tests.image.digest (or @sha256: in an extra container)"
CKV_K8S_15: "an image pulled by tag uses IfNotPresent, so a spot restart needs no registry round trip; a digest or pullPolicy Always passes"
CKV_K8S_8: "torchrun has no health endpoint, and restarting a node mid-collective stalls every peer; a hung rendezvous is bounded by join_timeout and the gate timeout instead"
CKV_K8S_9: "workers serve no traffic; a readiness probe would only hide pods from the headless Service DNS the peers resolve"
CKV_K8S_10: "the chart cannot size a training pod: CPU and memory depend on the model and the nodes, so worker.resources (or the group's) is the user's to set"
CKV_K8S_11: "a CPU limit throttles data loading and the collectives of a training process; set worker.resources.limits.cpu to opt in"
CKV_K8S_12: "the chart cannot size a training pod: CPU and memory depend on the model and the nodes, so worker.resources (or the group's) is the user's to set"
CKV_K8S_13: "the chart cannot size a training pod, and a memory limit hit mid-step kills the node out of the collective: worker.resources.limits.memory is the user's to set"
CKV_K8S_22: "the user's training code and its libraries write caches (torch compile, triton) under /tmp and $HOME and outputs where they like; worker.containerSecurityContext can make the root read-only"
CKV_K8S_25: "capabilities were added by the user (worker.containerSecurityContext, worker.initContainerSecurityContext or an extra container), e.g. IPC_LOCK for RDMA or a fabric daemon's NET_ADMIN"
CKV_K8S_35: "the user passes a Secret by environment (worker.envFrom or worker.env valueFrom) to the training script, which reads it there"
CKV_K8S_38: "init-topology reads its Node through the API (the elastic-job-cluster chart binds get on nodes); the worker container sees the token only when it scales the job down or records Events, an extra container only when worker.extraContainersWithToken names it"
CKV_K8S_19: "worker.hostNetwork was set by the user: the fabric needs the node's network namespace"
CKV2_K8S_6: "networkPolicy.enabled was turned off by the user (a CNI without NetworkPolicy, or the cluster's own policies)"
test-CKV_K8S_8: "a one-shot helm test pod that exits within seconds needs no liveness probe"
test-CKV_K8S_9: "a one-shot helm test pod serves nothing, so it needs no readiness probe"
{{- end -}}

{{/* checkov.io/skipN annotations from a list of check ids (or test-<id> for the test pod). */}}
{{- define "elastic-job.checkovAnnotations" -}}
{{- $reasons := include "elastic-job.checkovReasons" . | fromYaml -}}
{{- range $i, $key := .ids }}
{{- $reason := index $reasons $key | required (printf "chart bug: %s has no reason in elastic-job.checkovReasons" $key) }}
checkov.io/skip{{ add1 $i }}: {{ printf "%s=%s" (trimPrefix "test-" $key) $reason | quote }}
{{- end -}}
{{- end -}}

{{/*
Image checks of a pod's containers, a list of (dict "image" ref "pullPolicy" policy):
CKV_K8S_43 fails when one image has no digest, CKV_K8S_15 when one of those is not
pulled Always.
*/}}
{{- define "elastic-job.checkovImageIds" -}}
{{- $ids := list -}}
{{- range $c := . -}}
{{- if not (contains "@sha256:" (toString $c.image)) -}}
{{- $ids = append $ids "CKV_K8S_43" -}}
{{- if ne (toString $c.pullPolicy) "Always" }}{{ $ids = append $ids "CKV_K8S_15" }}{{ end -}}
{{- end -}}
{{- end -}}
{{- toYaml (uniq $ids) -}}
{{- end -}}

{{/* The checks a worker StatefulSet fails in this configuration (ids). */}}
{{- define "elastic-job.workerCheckovSkips" -}}
{{- $w := .root.Values.worker -}}
{{- $images := list
  (dict "image" (include "elastic-job.image" (dict "root" .root "image" .root.Values.initTopology.image)) "pullPolicy" .root.Values.initTopology.image.pullPolicy)
  (dict "image" (include "elastic-job.image" (dict "root" .root "image" $w.image)) "pullPolicy" $w.image.pullPolicy) -}}
{{- $secretEnv := false -}}
{{- range $e := $w.envFrom }}{{ if $e.secretRef }}{{ $secretEnv = true }}{{ end }}{{ end -}}
{{- range $v := .settings.env }}{{ if and (kindIs "map" $v) (($v.valueFrom | default dict).secretKeyRef) }}{{ $secretEnv = true }}{{ end }}{{ end -}}
{{- $added := ((($w.containerSecurityContext.capabilities | default dict).add) | default list) -}}
{{- $added = concat $added (((($w.initContainerSecurityContext | default dict).capabilities | default dict).add) | default list) -}}
{{- range $list := list "extraInitContainers" "extraContainers" -}}
{{- range $c := index $w $list -}}
{{- $images = append $images (dict "image" $c.image "pullPolicy" $c.imagePullPolicy) -}}
{{- $added = concat $added (((($c.securityContext | default dict).capabilities | default dict).add) | default list) -}}
{{- range $e := $c.envFrom }}{{ if $e.secretRef }}{{ $secretEnv = true }}{{ end }}{{ end -}}
{{- range $e := $c.env }}{{ if (($e.valueFrom | default dict).secretKeyRef) }}{{ $secretEnv = true }}{{ end }}{{ end -}}
{{- end -}}
{{- end -}}
{{- $ids := include "elastic-job.checkovImageIds" $images | fromYamlArray -}}
{{- $ids = concat $ids (list "CKV_K8S_8" "CKV_K8S_9") -}}
{{- $res := .settings.resources | default dict -}}
{{- $requests := $res.requests | default dict -}}
{{- $limits := $res.limits | default dict -}}
{{- if not $requests.cpu }}{{ $ids = append $ids "CKV_K8S_10" }}{{ end -}}
{{- if not $limits.cpu }}{{ $ids = append $ids "CKV_K8S_11" }}{{ end -}}
{{- if not $requests.memory }}{{ $ids = append $ids "CKV_K8S_12" }}{{ end -}}
{{- if not $limits.memory }}{{ $ids = append $ids "CKV_K8S_13" }}{{ end -}}
{{- if not $w.containerSecurityContext.readOnlyRootFilesystem }}{{ $ids = append $ids "CKV_K8S_22" }}{{ end -}}
{{- if $added }}{{ $ids = append $ids "CKV_K8S_25" }}{{ end -}}
{{- if $secretEnv }}{{ $ids = append $ids "CKV_K8S_35" }}{{ end -}}
{{- if $w.automountServiceAccountToken }}{{ $ids = append $ids "CKV_K8S_38" }}{{ end -}}
{{- if $w.hostNetwork }}{{ $ids = append $ids "CKV_K8S_19" }}{{ end -}}
{{- if not .root.Values.networkPolicy.enabled }}{{ $ids = append $ids "CKV2_K8S_6" }}{{ end -}}
{{- toYaml $ids -}}
{{- end -}}
