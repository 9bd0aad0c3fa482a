{{/* The rendezvous: the bundled etcd or an external one, torchrun's backend, endpoint,
TLS Secrets and --rdzv-conf. Names and labels are in _helpers.tpl. */}}

{{/*
A helper of the bundled etcd-rendezvous chart, called as that chart calls it, so its names
have one definition: (dict "root" $ "helper" "fullname") -> etcd-rendezvous.fullname with
the subchart's context (its values, with its defaults and the globals Helm merged in, its
chart name, this release). Only while the subchart is enabled.
*/}}
{{- define "elastic-job.etcd" -}}
{{- $ctx := dict "Values" (index .root.Values "etcd-rendezvous") "Chart" (dict "Name" "etcd-rendezvous" "IsRoot" false) "Release" .root.Release -}}
{{- include (printf "etcd-rendezvous.%s" .helper) $ctx -}}
{{- end -}}

{{- define "elastic-job.etcdEnabled" -}}
{{- $etcd := index .Values "etcd-rendezvous" | default dict -}}
{{- if (hasKey $etcd "enabled" | ternary $etcd.enabled true) }}true{{ end -}}
{{- end -}}

{{/*
The bundled etcd's StatefulSet, which a finished job scales to 0 after its workers so that
nothing (its PodDisruptionBudget) pins a node; empty with an external rendezvous.
*/}}
{{- define "elastic-job.rdzvStatefulset" -}}
{{- if include "elastic-job.etcdEnabled" . -}}
{{- include "elastic-job.etcd" (dict "root" . "helper" "statefulsetName") -}}
{{- end -}}
{{- end -}}

{{/* torchrun's rendezvous backend, etcd-v2, etcd-v3 or etcd-lease: global.rendezvousBackend,
the one value the bundled etcd follows too (etcd-rendezvous.backend reads the same global). */}}
{{- define "elastic-job.rdzvBackend" -}}
{{- (.Values.global | default dict).rendezvousBackend | default "etcd-v2" -}}
{{- end -}}

{{/* Rendezvous endpoint host:port: the bundled etcd's client Service, or the external one. */}}
{{- define "elastic-job.rdzvEndpoint" -}}
{{- if include "elastic-job.etcdEnabled" . -}}
{{- include "elastic-job.etcd" (dict "root" . "helper" "clientEndpoint") -}}
{{- else -}}
{{- .Values.rendezvous.endpoint -}}
{{- end -}}
{{- end -}}

{{/*
Secrets of the rendezvous TLS: rendezvous.tls.caSecret / clientCertSecret, else, when the
bundled etcd has cert-manager issue its certificates, the Secrets it names.
*/}}
{{- define "elastic-job.rdzvCaSecret" -}}
{{- $etcd := index .Values "etcd-rendezvous" | default dict -}}
{{- $etcdTls := $etcd.tls | default dict -}}
{{- if .Values.rendezvous.tls.caSecret -}}
{{- .Values.rendezvous.tls.caSecret -}}
{{- else if and (include "elastic-job.etcdEnabled" .) $etcdTls.enabled ($etcdTls.certManager | default dict).enabled -}}
{{- include "elastic-job.etcd" (dict "root" . "helper" "serverSecret") -}}
{{- end -}}
{{- end -}}

{{- define "elastic-job.rdzvClientSecret" -}}
{{- $etcd := index .Values "etcd-rendezvous" | default dict -}}
{{- $etcdTls := $etcd.tls | default dict -}}
{{- if .Values.rendezvous.tls.clientCertSecret -}}
{{- .Values.rendezvous.tls.clientCertSecret -}}
{{- else if and .Values.rendezvous.tls.enabled (include "elastic-job.etcdEnabled" .) $etcdTls.enabled $etcdTls.clientCertAuth ($etcdTls.certManager | default dict).enabled -}}
{{- include "elastic-job.etcd" (dict "root" . "helper" "clientSecret") -}}
{{- end -}}
{{- end -}}

{{/* torchrun --rdzv-conf, "k=v,k=v": the same keys for the etcd-v2, etcd-v3 and etcd-lease
handlers (etcd-lease reads torch's timing keys the same way; the others are both
torch's dynamic rendezvous; TLS keys named alike). */}}
{{- define "elastic-job.rdzvConf" -}}
{{- $r := .Values.rendezvous -}}
{{- $conf := list
  (printf "join_timeout=%v" ($r.joinTimeout | int64))
  (printf "last_call_timeout=%v" ($r.lastCallTimeout | int64))
  (printf "close_timeout=%v" ($r.closeTimeout | int64)) -}}
{{- /* null: the worker derives it from ELASTIC_MAX_NODES (elastic_worker.settings.schema). */ -}}
{{- if not (kindIs "invalid" $r.keepAliveInterval) -}}
{{- $conf = append $conf (printf "keep_alive_interval=%v" ($r.keepAliveInterval | int64)) -}}
{{- end -}}
{{- $conf = append $conf (printf "keep_alive_max_attempt=%v" ($r.keepAliveMaxAttempt | int64)) -}}
{{- range $k, $v := $r.extraConf -}}
{{- $conf = append $conf (printf "%s=%s" $k (include "elastic-job.str" $v)) -}}
{{- end -}}
{{- if $r.tls.enabled -}}
{{- $conf = append $conf "protocol=https" -}}
{{- $conf = append $conf "ca_cert=/etc/elastic-job/rendezvous-ca/ca.crt" -}}
{{- if include "elastic-job.rdzvClientSecret" . -}}
{{- $conf = append $conf "ssl_cert=/etc/elastic-job/rendezvous-client/tls.crt" -}}
{{- $conf = append $conf "ssl_cert_key=/etc/elastic-job/rendezvous-client/tls.key" -}}
{{- end -}}
{{- end -}}
{{- join "," $conf -}}
{{- end -}}
