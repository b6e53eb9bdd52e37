{{/* epp's name: the release truncated to 40 characters, plus -epp (as upstream). */}}
{{- define "epp.name" -}}
{{- printf "%s-epp" (.Release.Name | trunc 40 | trimSuffix "-") -}}
{{- end -}}

{{- define "epp.labels" -}}
app.kubernetes.io/name: {{ include "epp.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}

{{- define "epp.selectorLabels" -}}
inferencepool: {{ include "epp.name" . }}
{{- end -}}

{{- define "epp.poolGroup" -}}
{{- (split "/" .Values.inferencePool.apiVersion)._0 -}}
{{- end -}}
