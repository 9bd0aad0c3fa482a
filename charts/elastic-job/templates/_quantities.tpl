{{/* Kubernetes quantities read in templates (sizes compared, multiplied). */}}

{{/*
The leading number of a Kubernetes quantity (resource.Quantity's grammar): sign, digits,
an optional point and fraction ("1", "1.5", "1.", ".5"). Its suffix is the rest.
*/}}
{{- define "elastic-job.quantityNumber" -}}
{{- regexFind "^[+-]?([0-9]+(\\.[0-9]*)?|\\.[0-9]+)" (include "elastic-job.str" .) -}}
{{- end -}}

{{/*
A Kubernetes quantity in bytes (as a float), for comparing sizes, in every form the API
server takes: binary suffixes ("1Gi"), decimal ones ("2G", "500m"), exponents ("1e9",
"1.5E3"), plain numbers and YAML numbers (1073741824, which Helm holds as 1.073741824e+09).
Returns "" when it is none of these (callers refuse it, naming the value).
*/}}
{{- define "elastic-job.bytes" -}}
{{- $q := include "elastic-job.str" . -}}
{{- $num := include "elastic-job.quantityNumber" . -}}
{{- $suffix := trimPrefix $num $q -}}
{{- $mult := dict "" 1.0 "m" 0.001 "k" 1e3 "M" 1e6 "G" 1e9 "T" 1e12 "P" 1e15 "E" 1e18 "Ki" 1024.0 "Mi" 1048576.0 "Gi" 1073741824.0 "Ti" 1099511627776.0 "Pi" 1125899906842624.0 "Ei" 1152921504606846976.0 -}}
{{- if not $num -}}
{{- else if hasKey $mult $suffix -}}
{{- mulf (float64 $num) (index $mult $suffix) -}}
{{- else if regexMatch "^[eE][+-]?[0-9]{1,2}$" $suffix -}}
{{- /* "1E" is exa, "1E3" a thousand; exponents of at most two digits keep it finite. */ -}}
{{- float64 $q -}}
{{- end -}}
{{- end -}}

{{/* A quantity times a count, keeping its unit: (dict "q" "16Gi" "n" 2) -> "32Gi". */}}
{{- define "elastic-job.quantityTimes" -}}
{{- $q := include "elastic-job.str" .q -}}
{{- $num := include "elastic-job.quantityNumber" .q -}}
{{- $unit := trimPrefix $num $q -}}
{{- $total := mulf (float64 $num) (float64 .n) -}}
{{- if eq $total (float64 (int64 $total)) -}}
{{- printf "%d%s" (int64 $total) $unit -}}
{{- else -}}
{{- printf "%v%s" $total $unit -}}
{{- end -}}
{{- end -}}
