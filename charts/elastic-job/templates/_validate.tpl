{{/*
Cross-field rules the schema cannot express. Each message names the value and says what to
do. Included once, from worker-statefulset.yaml (rendered on every install).
*/}}
{{- define "elastic-job.validate" -}}
{{- $v := .Values -}}
{{- $min := $v.job.minNodes | int64 -}}
{{- $max := $v.job.maxNodes | int64 -}}
{{- if gt $min $max -}}
{{- fail (printf "job.minNodes (%d) is greater than job.maxNodes (%d): set job.minNodes <= job.maxNodes" $min $max) -}}
{{- end -}}
{{- /* Empty arguments where they can only be a mistake: the program, and after a Python
interpreter the script (or the module after -m). Empty arguments elsewhere are data. */ -}}
{{- $cmd := list -}}
{{- range $v.job.command }}{{ $cmd = append $cmd (include "elastic-job.str" .) }}{{ end -}}
{{- if not (trim (first $cmd)) -}}
{{- fail (printf "job.command[0] is %q: it is the program torchrun starts and cannot be empty; start job.command with it, e.g. [python, /workspace/train.py]" (first $cmd)) -}}
{{- end -}}
{{- if regexMatch "^python([0-9]+(\\.[0-9]+)?)?$" (base (first $cmd)) -}}
{{- /* A missing script is the same mistake: python would read its closed stdin and exit 0. */ -}}
{{- $at := ternary 2 1 (and (gt (len $cmd) 1) (eq (index $cmd 1) "-m")) -}}
{{- $arg := "missing" -}}
{{- if gt (len $cmd) $at }}{{ $arg = index $cmd $at | quote }}{{ end -}}
{{- if or (eq $arg "missing") (not (trim (index $cmd $at))) -}}
{{- fail (printf "job.command[%d] is %s: after %s it names the %s to run and cannot be empty, e.g. [%s, /workspace/train.py] or [%s, -m, mypkg.train]" $at $arg (join " " (slice $cmd 0 $at)) (ternary "module" "script" (eq $at 2)) (first $cmd) (first $cmd)) -}}
{{- end -}}
{{- end -}}
{{- /* One pass over the groups, no list built (a sprig append copies the list: N groups
would cost N squared): $names maps each StatefulSet name to its group. */ -}}
{{- $names := dict -}}
{{- $replicas := 0 -}}
{{- range $name, $g := $v.workerGroups -}}
{{- if $g -}}
{{- if not (hasKey $g "replicas") -}}
{{- fail (printf "workerGroups.%s.replicas is required: set the number of pods of the group" $name) -}}
{{- end -}}
{{- $replicas = add $replicas ($g.replicas | int64) -}}
{{- $sts := include "elastic-job.statefulsetName" (dict "root" $ "group" $name) -}}
{{- if hasKey $names $sts -}}
{{- fail (printf "workerGroups.%s and workerGroups.%s give the same StatefulSet name %q after cutting to 52 characters: shorten the group names or fullnameOverride" (index $names $sts) $name $sts) -}}
{{- end -}}
{{- $_ := set $names $sts $name -}}
{{- end -}}
{{- end -}}
{{- if not $names -}}
{{- fail "workerGroups has no group: define at least one, e.g. workerGroups.default.replicas=2" -}}
{{- end -}}
{{- if lt (int64 $replicas) $min -}}
{{- fail (printf "workerGroups replicas add up to %d, fewer than job.minNodes (%d): the job (and its gang, minMember = job.minNodes) could never start; raise workerGroups.<name>.replicas or lower job.minNodes" (int64 $replicas) $min) -}}
{{- end -}}
{{- /* Workers and the bundled etcd share the namespace: pods, Services, NetworkPolicies. */ -}}
{{- if include "elastic-job.etcdEnabled" . -}}
{{- $etcdSts := include "elastic-job.etcd" (dict "root" $ "helper" "statefulsetName") -}}
{{- $naming := printf "release name %q, fullnameOverride %q, etcd-rendezvous.fullnameOverride %q" $.Release.Name ($v.fullnameOverride | toString) ((index $v "etcd-rendezvous").fullnameOverride | toString) -}}
{{- if hasKey $names $etcdSts -}}
{{- fail (printf "workerGroups.%s: its StatefulSet name %q is also the bundled etcd's (%s), so their pods would collide: use a shorter release name, or set fullnameOverride or etcd-rendezvous.fullnameOverride to tell them apart" (index $names $etcdSts) $etcdSts $naming) -}}
{{- end -}}
{{- $workers := include "elastic-job.workerServiceName" . -}}
{{- $etcdNames := list (include "elastic-job.etcd" (dict "root" $ "helper" "fullname")) (include "elastic-job.etcd" (dict "root" $ "helper" "headlessName")) -}}
{{- if has $workers $etcdNames -}}
{{- fail (printf "the workers' Service and NetworkPolicy name %q is also a bundled etcd object's name (%s): set fullnameOverride or etcd-rendezvous.fullnameOverride to tell them apart" $workers $naming) -}}
{{- end -}}
{{- end -}}
{{- /* The rendezvous endpoint. */ -}}
{{- if include "elastic-job.etcdEnabled" . -}}
{{- if $v.rendezvous.endpoint -}}
{{- fail (printf "rendezvous.endpoint %q is set while etcd-rendezvous.enabled is true: set etcd-rendezvous.enabled=false to use an external etcd, or clear rendezvous.endpoint" $v.rendezvous.endpoint) -}}
{{- end -}}
{{- $etcd := index $v "etcd-rendezvous" -}}
{{- $etcdTls := and $etcd.tls $etcd.tls.enabled -}}
{{- if ne (not (not $etcdTls)) (not (not $v.rendezvous.tls.enabled)) -}}
{{- fail (printf "rendezvous.tls.enabled (%v) differs from etcd-rendezvous.tls.enabled (%v): enable TLS on both or neither" $v.rendezvous.tls.enabled (not (not $etcdTls))) -}}
{{- end -}}
{{- else -}}
{{- if not $v.rendezvous.endpoint -}}
{{- if ne (include "elastic-job.rdzvBackend" .) "etcd-v2" -}}
{{- fail (printf "rendezvous.endpoint is empty while etcd-rendezvous.enabled is false: set rendezvous.endpoint to host:port of an etcd 3.5 or 3.6 (global.rendezvousBackend=%s uses its v3 API)" (include "elastic-job.rdzvBackend" .)) -}}
{{- else -}}
{{- fail "rendezvous.endpoint is empty while etcd-rendezvous.enabled is false: set rendezvous.endpoint to host:port of an etcd 3.5 with the v2 API on (or, for an etcd 3.6, set global.rendezvousBackend=etcd-v3)" -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if and $v.rendezvous.tls.enabled (not (include "elastic-job.rdzvCaSecret" .)) -}}
{{- fail "rendezvous.tls.caSecret is empty while rendezvous.tls.enabled is true: name the Secret holding ca.crt (or let the bundled etcd's etcd-rendezvous.tls.certManager issue it)" -}}
{{- end -}}
{{- if include "elastic-job.etcdEnabled" . -}}
{{- $etcdTls := (index $v "etcd-rendezvous").tls | default dict -}}
{{- if and $etcdTls.enabled $etcdTls.clientCertAuth (not (include "elastic-job.rdzvClientSecret" .)) -}}
{{- fail "rendezvous.tls.clientCertSecret is empty while etcd-rendezvous.tls.clientCertAuth requires client certificates: name a kubernetes.io/tls Secret signed by the etcd CA (or use etcd-rendezvous.tls.certManager)" -}}
{{- end -}}
{{- end -}}
{{- if and $v.rendezvous.tls.clientCertSecret (not $v.rendezvous.tls.enabled) -}}
{{- fail "rendezvous.tls.clientCertSecret is set but rendezvous.tls.enabled is false: enable TLS or clear it" -}}
{{- end -}}
{{- if ge (float64 $v.rendezvous.lastCallTimeout) (float64 $v.rendezvous.joinTimeout) -}}
{{- fail (printf "rendezvous.lastCallTimeout (%v) must be shorter than rendezvous.joinTimeout (%v)" $v.rendezvous.lastCallTimeout $v.rendezvous.joinTimeout) -}}
{{- end -}}
{{- if and $v.rendezvous.lifeline.enabled $v.monitoring.enabled (eq (int64 $v.rendezvous.lifeline.port) (int64 $v.monitoring.port)) -}}
{{- fail (printf "rendezvous.lifeline.port and monitoring.port are both %d: the container cannot serve both on one port; give one of them another port" (int64 $v.monitoring.port)) -}}
{{- end -}}
{{- /* Variables whose values come from node labels: a rule, not a list of known-bad names
(the same rule in images/init-topology). Only the families a node's fabric is tuned by, and
none that loads code or says where code is loaded from. */ -}}
{{- range $name, $_ := $v.topology.labelMap -}}
{{- if or (not (regexMatch "^(NODE|NCCL|GLOO|FI|UCX)_[A-Z0-9_]*$" $name)) (regexMatch "PLUGIN|PATH|LIB|PRELOAD|DIR|FILE|CONF|MODULE" $name) -}}
{{- fail (printf "topology.labelMap.%s: %q may not be set from a node label: a variable name must start with NODE_, NCCL_, GLOO_, FI_ or UCX_, use only A-Z, 0-9 and _, and contain none of PLUGIN, PATH, LIB, PRELOAD, DIR, FILE, CONF, MODULE (they load code, say where it is loaded from, or name a file read or written); rename it, e.g. NODE_POOL" $name $name) -}}
{{- end -}}
{{- end -}}
{{- $shm := include "elastic-job.str" $v.worker.shmSizeLimit -}}
{{- $shmBytes := include "elastic-job.bytes" $v.worker.shmSizeLimit -}}
{{- if not $shmBytes -}}
{{- fail (printf "worker.shmSizeLimit %q is not a Kubernetes quantity: write it like 1Gi, 512Mi, 2G, 1e9 or 1073741824" $shm) -}}
{{- end -}}
{{- if and $v.checkpoint.enabled (not $v.checkpoint.existingClaim) -}}
{{- fail "checkpoint.existingClaim is empty while checkpoint.enabled is true: name an existing PersistentVolumeClaim (ReadWriteMany when pods span nodes)" -}}
{{- end -}}
{{- if and $v.mesh.required (not $v.mesh.interfaces) -}}
{{- fail "mesh.required is true but mesh.interfaces is empty: name the mesh interface globs, e.g. wg*" -}}
{{- end -}}
{{- if and $v.monitoring.podMonitor.enabled (not $v.monitoring.enabled) -}}
{{- fail "monitoring.podMonitor.enabled is true but monitoring.enabled is false: the workers serve no metrics then; set monitoring.enabled=true too" -}}
{{- end -}}
{{- /* What a release no longer creates: cluster-wide objects, written once for every job by
the elastic-job-cluster chart. The keys stay in the schema only to say where they went. */ -}}
{{- if ($v.rbac.nodeReader | default dict).enabled -}}
{{- fail (printf "rbac.nodeReader.enabled: a release creates no cluster-scoped object any more; the node reader (get on nodes, for init-topology) is bound once per namespace by the elastic-job-cluster chart: have a cluster admin run `helm install elastic-job-cluster charts/elastic-job-cluster --set nodeReader.namespaces.%s=true`, and remove rbac.nodeReader from this release's values" .Release.Namespace) -}}
{{- end -}}
{{- range $what := list "prometheusRule" "dashboard" -}}
{{- if (index $v.monitoring $what | default dict).enabled -}}
{{- fail (printf "monitoring.%s.enabled: the alerts and the dashboard are written once for every job by the elastic-job-cluster chart (grouped by namespace and job): have a cluster admin install it with %s.enabled=true (charts/elastic-job-cluster/README.md), and remove monitoring.%s from this release's values" $what $what $what) -}}
{{- end -}}
{{- end -}}
{{- /* Names the chart sets on the worker container; the user's env must not repeat them. */ -}}
{{- $owned := list "ELASTIC_JOB_ID" "ELASTIC_RDZV_ENDPOINT" "ELASTIC_RDZV_BACKEND" "ELASTIC_MIN_NODES" "ELASTIC_MAX_NODES" "ELASTIC_NPROC_PER_NODE" "ELASTIC_MAX_RESTARTS" "ELASTIC_RDZV_CONF" "ELASTIC_MONITOR_INTERVAL" "ELASTIC_EXIT_BARRIER_TIMEOUT" "ELASTIC_LOSS_DETECTION" "ELASTIC_LIFELINE" "ELASTIC_LIFELINE_PORT" "ELASTIC_WARM_START" "ELASTIC_WARM_PRELOAD" "ELASTIC_GATE_TIMEOUT" "ELASTIC_GATE_PEERS" "ELASTIC_MESH_INTERFACES" "ELASTIC_MESH_REQUIRED" "ELASTIC_INJECT_ENV" "ELASTIC_GRACE_PERIOD" "ELASTIC_SCALE_DOWN" "ELASTIC_STATEFULSETS_FILE" "ELASTIC_RENDEZVOUS_STATEFULSET" "ELASTIC_GROUP" "ELASTIC_METRICS" "ELASTIC_METRICS_PORT" "ELASTIC_EVENTS" "ELASTIC_RECLAIM" "ELASTIC_RECLAIM_AFTER" "ELASTIC_HANG_DETECTION" "ELASTIC_HANG_STEP_MULTIPLE" "ELASTIC_HANG_FLOOR" "ELASTIC_HANG_FIRST_STEP" "ELASTIC_TOPOLOGY_MISMATCH" "CHECKPOINT_DIR" "POD_NAME" "POD_NAMESPACE" "POD_IP" "POD_UID" "NODE_NAME" -}}
{{- range $name, $g := $v.workerGroups -}}
{{- if $g -}}
{{- $s := include "elastic-job.groupSettings" (dict "root" $ "name" $name "group" $g) | fromYaml -}}
{{- range $key, $_ := $s.env -}}
{{- if has $key $owned -}}
{{- $where := ternary (printf "workerGroups.%s.env.%s" $name $key) (printf "worker.env.%s" $key) (hasKey ($g.env | default dict) $key) -}}
{{- fail (printf "%s: %s is set by the chart (see docs/contracts.md); use the matching chart value instead" $where $key) -}}
{{- end -}}
{{- end -}}
{{- $gpus := $s.gpus | default 0 | int64 -}}
{{- if and (gt $gpus 0) (not (kindIs "string" $v.job.nprocPerNode)) (gt ($v.job.nprocPerNode | int64) $gpus) -}}
{{- fail (printf "job.nprocPerNode (%d) exceeds the GPUs per pod of workerGroups.%s (%d): one process per GPU at most" ($v.job.nprocPerNode | int64) $name $gpus) -}}
{{- end -}}
{{- $limits := ($s.resources | default dict).limits | default dict -}}
{{- if $limits.memory -}}
{{- $limit := include "elastic-job.str" $limits.memory -}}
{{- $where := ternary (printf "workerGroups.%s.resources.limits.memory" $name) "worker.resources.limits.memory" (hasKey $g "resources") -}}
{{- $limitBytes := include "elastic-job.bytes" $limits.memory -}}
{{- if not $limitBytes -}}
{{- fail (printf "%s %q is not a Kubernetes quantity: write it like 32Gi, 512Mi, 2G, 1e9 or 1073741824" $where $limit) -}}
{{- end -}}
{{- if gt (float64 $shmBytes) (float64 $limitBytes) -}}
{{- fail (printf "worker.shmSizeLimit (%s) exceeds the memory limit of workerGroups.%s (%s = %s): /dev/shm counts against it; lower worker.shmSizeLimit or raise the limit" $shm $name $where $limit) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if and $v.nodeLoss.reclaim.enabled (not (and (or $v.serviceAccount.create $v.serviceAccount.name) $v.worker.automountServiceAccountToken)) -}}
{{- fail "nodeLoss.reclaim.enabled is true but the workers have no token to delete a pod with: it needs a ServiceAccount (serviceAccount.create=true, or serviceAccount.name) and worker.automountServiceAccountToken=true; set those, or nodeLoss.reclaim.enabled=false" -}}
{{- end -}}
{{- if and $v.gang.volcano.enabled (not $v.gang.volcano.queue) -}}
{{- fail "gang.volcano.queue is empty while gang.volcano.enabled is true: name a Volcano queue (e.g. default)" -}}
{{- end -}}
{{- include "elastic-job.validateGang" . -}}
{{- include "elastic-job.validatePod" . -}}
{{- end -}}

{{/* Gang admission: Volcano or Kueue, and what Kueue can admit. */}}
{{- define "elastic-job.validateGang" -}}
{{- $v := .Values -}}
{{- $k := $v.gang.kueue -}}
{{- if and $v.gang.volcano.enabled $k.enabled -}}
{{- fail "gang.volcano.enabled and gang.kueue.enabled are both true: a job is admitted by one of them; set one to false" -}}
{{- end -}}
{{- if $k.enabled -}}
{{- if and (not $k.queueName) (not $k.localQueue.create) -}}
{{- fail "gang.kueue.queueName is empty while gang.kueue.enabled is true: name the LocalQueue of this namespace the job is submitted to, or set gang.kueue.localQueue.create=true and gang.kueue.localQueue.clusterQueue" -}}
{{- end -}}
{{- if and $k.localQueue.create (not $k.localQueue.clusterQueue) -}}
{{- fail "gang.kueue.localQueue.clusterQueue is empty while gang.kueue.localQueue.create is true: name the ClusterQueue the LocalQueue submits to" -}}
{{- end -}}
{{- /* Kueue admits each StatefulSet whole and alone: a group smaller than job.minNodes
could be admitted first and hold its quota while its pods wait for the others. A group at 0
replicas makes no Workload until it is scaled up. */ -}}
{{- range $name, $g := $v.workerGroups -}}
{{- if and $g (gt ($g.replicas | int64) 0) (lt ($g.replicas | int64) ($v.job.minNodes | int64)) -}}
{{- fail (printf "workerGroups.%s.replicas (%d) is below job.minNodes (%d) while gang.kueue.enabled: Kueue admits each group's StatefulSet as its own all-or-nothing Workload, so this group could be admitted alone and hold its quota without ever training; give every group at least job.minNodes replicas, lower job.minNodes, or use gang.volcano (one PodGroup over all groups)" $name ($g.replicas | int64) ($v.job.minNodes | int64)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The pod settings fabrics add: names the chart owns, images, host networking. */}}
{{- define "elastic-job.validatePod" -}}
{{- $v := .Values -}}
{{- $w := $v.worker -}}
{{- $seen := dict "init-topology" "the chart's init container" "worker" "the chart's worker container" -}}
{{- if eq $w.entrypoint "injected" -}}
{{- $_ := set $seen "inject-worker" "the chart's init container of worker.entrypoint=injected" -}}
{{- end -}}
{{- range $list := list "extraInitContainers" "extraContainers" -}}
{{- range $i, $c := index $w $list -}}
{{- if hasKey $seen $c.name -}}
{{- fail (printf "worker.%s[%d].name %q is already %s: container names in a pod are unique; rename it" $list $i $c.name (index $seen $c.name)) -}}
{{- end -}}
{{- $_ := set $seen $c.name (printf "worker.%s[%d]" $list $i) -}}
{{- end -}}
{{- end -}}
{{- range $i, $name := $w.extraContainersWithToken -}}
{{- if not $w.automountServiceAccountToken -}}
{{- fail (printf "worker.extraContainersWithToken[%d] is %q but worker.automountServiceAccountToken is false: no container gets the token; set it to true or empty the list" $i $name) -}}
{{- end -}}
{{- if or (not (hasKey $seen $name)) (has $name (list "init-topology" "inject-worker" "worker")) -}}
{{- fail (printf "worker.extraContainersWithToken[%d] is %q, which names no container of worker.extraInitContainers or worker.extraContainers: list only their names" $i $name) -}}
{{- end -}}
{{- end -}}
{{- range $at, $img := dict "initTopology.image" $v.initTopology.image "worker.image" $w.image "tests.image" $v.tests.image -}}
{{- if and $img.digest (contains "@" ($img.tag | toString)) -}}
{{- fail (printf "%s.tag %q already holds a digest and %s.digest is set too: keep one (%s.digest, with the plain tag)" $at ($img.tag | toString) $at $at) -}}
{{- end -}}
{{- end -}}
{{- if and $w.hostNetwork (include "elastic-job.etcdEnabled" .) -}}
{{- $etcd := index $v "etcd-rendezvous" -}}
{{- if ($etcd.networkPolicy | default dict).enabled -}}
{{- fail "worker.hostNetwork is true while etcd-rendezvous.networkPolicy.enabled is true: NetworkPolicies cannot select host-network pods, so the bundled etcd's policy would drop every worker's connection; set etcd-rendezvous.networkPolicy.enabled=false (or turn hostNetwork off)" -}}
{{- end -}}
{{- end -}}
{{- end -}}
