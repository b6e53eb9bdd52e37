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
{{- (split "/" (.Values.inferencePool.apiVersion | default "inference.networking.k8s.io/v1"))._0 -}}
{{- end -}}

{{/* "true" when the replicas share speculative entries: active-active, more than one replica and a peer port; empty otherwise. */}}
{{- define "epp.sharePeers" -}}
{{- $s := include "epp.settings" . | fromYaml -}}
{{- $peers := .Values.inferenceExtension.speculativePeers | default dict -}}
{{- if and (gt (int $s.replicas) 1) (eq $s.haMode "active-active") (gt (int ($peers.port | default 0)) 0) -}}
true
{{- end -}}
{{- end -}}

{{/* The Secret holding replica sharing's mutual-TLS files (ca.crt, tls.crt, tls.key): speculativePeers.secretName, else the one this chart generates. */}}
{{- define "epp.peerSecret" -}}
{{- $peers := .Values.inferenceExtension.speculativePeers | default dict -}}
{{- $peers.secretName | default (printf "%s-peers-tls" (include "epp.name" .)) -}}
{{- end -}}

{{/* "true" when epp runs with leader election: more than one replica, haMode leader. */}}
{{- define "epp.leaderElection" -}}
{{- $s := include "epp.settings" . | fromYaml -}}
{{- if and (gt (int $s.replicas) 1) (ne $s.haMode "active-active") -}}
true
{{- end -}}
{{- end -}}
