{{- /*
Upstream values layouts, mapped onto one set of settings ("epp.settings", YAML; read it with
`include "epp.settings" . | fromYaml`). Two layouts are accepted:

  GIE v1.5 `inferencepool`:  inferenceExtension.*, inferencePool.*, provider, experimentalHttpRoute,
                             inferenceObjectives (this chart's own names are the same, plus a few
                             extras: haMode, kvEvents, speculativePeers, scorerWeights, ...)
  llm-d-router v0.10:        router.* (router.epp.*, router.modelServers.*, router.inferencePool.*,
                             router.monitoring, router.tracing, ...), provider, httpRoute

When both layouts set the same thing, the router.* value wins (this chart's defaults are in the GIE
names, so a router.* key is always the user's). Keys neither layout knows, and upstream features epp
or this chart cannot provide, fail the render with a message naming them.
*/ -}}

{{- /* Fails naming the keys of map `m` (at path `at`) that are not in `known`. */ -}}
{{- define "epp.checkKeys" -}}
{{- $unknown := list -}}
{{- range $k, $_ := .m -}}
{{- if not (has $k $.known) -}}
{{- $unknown = append $unknown (printf "%s%s" $.at $k) -}}
{{- end -}}
{{- end -}}
{{- if $unknown -}}
{{- fail (printf "unknown or unsupported values: %s (this chart accepts the GIE inferencepool and llm-d-router value layouts; see charts/inferencepool/README.md)" (join ", " (sortAlpha $unknown))) -}}
{{- end -}}
{{- end -}}

{{- /* A flag value as text: whole floats (YAML numbers) without an exponent. */ -}}
{{- define "epp.flagValue" -}}
{{- if and (kindIs "float64" .) (eq . (float64 (int64 .))) -}}
{{- int64 . -}}
{{- else -}}
{{- . -}}
{{- end -}}
{{- end -}}

{{- define "epp.settings" -}}
{{- $v := .Values -}}
{{- $ie := $v.inferenceExtension | default dict -}}
{{- $ip := $v.inferencePool | default dict -}}
{{- $r := $v.router | default dict -}}
{{- $re := $r.epp | default dict -}}
{{- $rms := $r.modelServers | default dict -}}
{{- $rip := $r.inferencePool | default dict -}}
{{- $es := $ie.endpointsServer | default dict -}}
{{- $router := not (empty $r) -}}

{{- /* Unknown keys. */ -}}
{{- include "epp.checkKeys" (dict "m" $v "at" "" "known" (list "inferenceExtension" "inferencePool" "inferenceObjectives" "inferenceModels" "provider" "experimentalHttpRoute" "router" "httpRoute" "global")) -}}
{{- include "epp.checkKeys" (dict "m" $ie "at" "inferenceExtension." "known" (list "replicas" "haMode" "kvEvents" "speculativePeers" "image" "extProcPort" "grpcHealthPort" "metricsPort" "failureMode" "env" "pluginsConfigFile" "pluginsCustomConfig" "extraContainerPorts" "extraServicePorts" "flags" "logVerbosity" "scorerWeights" "affinity" "tolerations" "resources" "sidecar" "monitoring" "tracing" "latencyPredictor" "metricsDataSource" "endpointsServer" "volumes" "volumeMounts" "podAnnotations")) -}}
{{- include "epp.checkKeys" (dict "m" $ip "at" "inferencePool." "known" (list "targetPorts" "modelServerType" "modelServerProtocol" "parser" "apiVersion" "modelServers" "failureMode")) -}}
{{- include "epp.checkKeys" (dict "m" ($ip.modelServers | default dict) "at" "inferencePool.modelServers." "known" (list "matchLabels")) -}}
{{- include "epp.checkKeys" (dict "m" $es "at" "inferenceExtension.endpointsServer." "known" (list "createInferencePool" "endpointSelector" "targetPorts" "modelServerType" "modelServerProtocol")) -}}
{{- include "epp.checkKeys" (dict "m" $r "at" "router." "known" (list "epp" "modelServers" "inferencePool" "monitoring" "tracing" "inferenceObjectives" "extraServicePorts" "clusterDomain" "proxy" "tokenizer" "latencyPredictor")) -}}
{{- include "epp.checkKeys" (dict "m" $re "at" "router.epp." "known" (list "replicas" "image" "extProcPort" "grpcHealthPort" "parsers" "metricsDataSource" "flags" "env" "pluginsConfigFile" "pluginsCustomConfig" "extraContainerPorts" "resources" "affinity" "tolerations" "podAnnotations" "volumes" "volumeMounts")) -}}
{{- include "epp.checkKeys" (dict "m" $rms "at" "router.modelServers." "known" (list "type" "protocol" "targetPorts" "matchLabels")) -}}
{{- include "epp.checkKeys" (dict "m" $rip "at" "router.inferencePool." "known" (list "create" "failureMode")) -}}

{{- /* Upstream features epp or this chart does not provide. */ -}}
{{- if ($ie.sidecar | default dict).enabled -}}
{{- fail "inferenceExtension.sidecar.enabled: this chart runs no sidecar next to epp (add the container with a kustomize patch)" -}}
{{- end -}}
{{- if or ($ie.latencyPredictor | default dict).enabled ($r.latencyPredictor | default dict).enabled -}}
{{- fail "latencyPredictor.enabled: upstream's latency-predictor sidecars and plugins are not implemented in epp" -}}
{{- end -}}
{{- if ($r.proxy | default dict).enabled -}}
{{- fail "router.proxy.enabled: this chart runs no proxy (Envoy/agentgateway) next to epp; route through a Gateway (Envoy Gateway reads InferencePools) or run Envoy yourself (config/examples/)" -}}
{{- end -}}
{{- if ($r.tokenizer | default dict).enabled -}}
{{- fail "router.tokenizer.enabled: this chart runs no vllm-render tokenizer sidecar; epp tokenizes in-process (prefix-cache-scorer / precise-prefix-cache-scorer parameters)" -}}
{{- end -}}
{{- if ((($v.provider | default dict).gke | default dict).preferredBackends | default dict).enabled -}}
{{- fail "provider.gke.preferredBackends.enabled: the preferred/standby StatefulSet layout is not supported by this chart" -}}
{{- end -}}

{{- $s := dict "layout" (ternary "router" "gie" $router) -}}

{{- /* Replicas, image. */ -}}
{{- $_ := set $s "replicas" (int (ternary $re.replicas ($ie.replicas | default 1) (hasKey $re "replicas"))) -}}
{{- $_ := set $s "haMode" ($ie.haMode | default "leader") -}}
{{- $img := mergeOverwrite (deepCopy ($ie.image | default dict)) ($re.image | default dict) -}}
{{- $repo := printf "%s/%s" ($img.hub | default "") ($img.name | default "") -}}
{{- if or $img.registry $img.repository -}}
{{- $repo = trimPrefix "/" (printf "%s/%s" ($img.registry | default "") ($img.repository | default "")) -}}
{{- end -}}
{{- if or (contains "gateway-api-inference-extension/epp" $repo) (contains "llm-d-router-endpoint-picker" $repo) -}}
{{- fail (printf "image %q is upstream's Go EPP; this chart runs epp (ghcr.io/epp-rs/epp): drop image.registry/repository/tag from the values or name an epp image" $repo) -}}
{{- end -}}
{{- $_ := set $s "image" (printf "%s:%s" $repo (toString ($img.tag | default $.Chart.AppVersion))) -}}
{{- $_ := set $s "pullPolicy" ($img.pullPolicy | default "IfNotPresent") -}}

{{- /* Ports. */ -}}
{{- $_ := set $s "extProcPort" (int (ternary $re.extProcPort ($ie.extProcPort | default 9002) (hasKey $re "extProcPort"))) -}}
{{- $_ := set $s "grpcHealthPort" (int ($re.grpcHealthPort | default $ie.grpcHealthPort | default 9003)) -}}
{{- $_ := set $s "metricsPort" (int ($ie.metricsPort | default 9090)) -}}

{{- /* Flags (router.epp.flags wins per key), env, pod extras. */ -}}
{{- $flags := mergeOverwrite (deepCopy ($ie.flags | default dict)) ($re.flags | default dict) -}}
{{- $texts := dict -}}
{{- range $k, $val := $flags -}}
{{- $_ := set $texts $k (include "epp.flagValue" $val) -}}
{{- end -}}
{{- $_ := set $s "flags" $texts -}}
{{- $env := ternary $re.env $ie.env (hasKey $re "env") | default list -}}
{{- if kindIs "map" $env -}}
{{- $list := list -}}
{{- range $k, $val := $env -}}
{{- $list = append $list (dict "name" $k "value" (include "epp.flagValue" $val)) -}}
{{- end -}}
{{- $env = $list -}}
{{- end -}}
{{- $_ := set $s "env" $env -}}
{{- range $key := list "resources" "extraContainerPorts" "volumes" "volumeMounts" "affinity" "tolerations" "podAnnotations" -}}
{{- $_ := set $s $key (ternary (index $re $key) (index $ie $key) (hasKey $re $key)) -}}
{{- end -}}
{{- $_ := set $s "extraServicePorts" (ternary $r.extraServicePorts $ie.extraServicePorts (hasKey $r "extraServicePorts")) -}}

{{- /* Monitoring. */ -}}
{{- $mon := ternary ($r.monitoring | default dict) ($ie.monitoring | default dict) (hasKey $r "monitoring") -}}
{{- $prom := $mon.prometheus | default dict -}}
{{- /* /metrics auth (TokenReview + SubjectAccessReview): on unless auth.enabled is false, as
     upstream; a --metrics-endpoint-auth flag wins. */ -}}
{{- $auth := $prom.auth | default dict -}}
{{- $metricsAuth := ternary $auth.enabled true (hasKey $auth "enabled") -}}
{{- if hasKey $s.flags "metrics-endpoint-auth" -}}
{{- $metricsAuth = eq (index $s.flags "metrics-endpoint-auth") "true" -}}
{{- end -}}
{{- $_ := set $s "metricsAuth" (not (not $metricsAuth)) -}}
{{- $_ := set $s "metricsSecret" ($auth.secretName | default "inference-gateway-sa-metrics-reader-secret") -}}
{{- if and $router $prom.enabled -}}
{{- $mp := (($mon.provider | default dict).name | default "") | lower -}}
{{- if or (eq $mp "gmp") (and (eq $mp "") (eq (lower (($v.provider | default dict).name | default "")) "gke")) -}}
{{- fail "router.monitoring: Google Managed Prometheus (monitoring.provider.name gmp, or provider.name gke) is not supported; set router.monitoring.provider.name: prometheusoperator for a ServiceMonitor" -}}
{{- end -}}
{{- end -}}
{{- $_ := set $s "monitoring" (dict "enabled" (not (not $prom.enabled)) "interval" ($prom.interval | default $mon.interval | default "10s") "extraLabels" ($prom.extraLabels | default dict)) -}}

{{- /* Tracing: --tracing and the OTEL_* environment, as upstream, when tracing.enabled is given. */ -}}
{{- $tr := ternary ($r.tracing | default dict) ($ie.tracing | default dict) (hasKey $r "tracing") -}}
{{- if hasKey $tr "enabled" -}}
{{- $sampling := $tr.sampling | default dict -}}
{{- $_ := set $s "tracing" (dict "enabled" (not (not $tr.enabled)) "endpoint" ($tr.otelExporterEndpoint | default "http://localhost:4317") "sampler" ($sampling.sampler | default "parentbased_traceidratio") "samplerArg" (toString ($sampling.samplerArg | default "0.1")) "serviceName" (ternary "llm-d-router/epp" "gateway-api-inference-extension/epp" (hasKey $r "tracing"))) -}}
{{- end -}}

{{- /* The model servers and the pool (or standalone discovery). */ -}}
{{- $standaloneGie := and (not (empty $es)) (not $es.createInferencePool) -}}
{{- $standalone := or (eq (toString $rip.create) "false") $standaloneGie -}}
{{- $_ := set $s "standalone" $standalone -}}
{{- $engine := $ip.modelServerType | default "vllm" -}}
{{- $protocol := $ip.modelServerProtocol | default "http" -}}
{{- if $standaloneGie -}}
{{- $engine = $es.modelServerType | default "vllm" -}}
{{- $protocol = $es.modelServerProtocol | default "http" -}}
{{- end -}}
{{- $engine = $rms.type | default $engine -}}
{{- $protocol = $rms.protocol | default $protocol -}}
{{- if eq $engine "triton" -}}
{{- fail "modelServers.type triton (generic NVIDIA Triton) is not supported by epp; its engines are vllm, sglang, trtllm-serve and triton-tensorrt-llm" -}}
{{- end -}}
{{- if not (has $engine (list "vllm" "sglang" "trtllm-serve" "triton-tensorrt-llm")) -}}
{{- fail (printf "model server type %q is not one of vllm, sglang, trtllm-serve, triton-tensorrt-llm" $engine) -}}
{{- end -}}
{{- if not (has $protocol (list "http" "grpc")) -}}
{{- fail (printf "model server protocol %q is not one of http, grpc" $protocol) -}}
{{- end -}}
{{- $_ := set $s "engine" $engine -}}
{{- $_ := set $s "protocol" $protocol -}}
{{- $ports := ternary $rms.targetPorts ($ip.targetPorts | default (list (dict "number" 8000))) (hasKey $rms "targetPorts") -}}
{{- $_ := set $s "targetPorts" $ports -}}
{{- $labels := ternary $rms.matchLabels (($ip.modelServers | default dict).matchLabels) (hasKey $rms "matchLabels") -}}
{{- $_ := set $s "matchLabels" ($labels | default dict) -}}
{{- if $standalone -}}
{{- $selector := list -}}
{{- range $k, $val := ($labels | default dict) -}}
{{- $selector = append $selector (printf "%s=%s" $k (toString $val)) -}}
{{- end -}}
{{- $numbers := list -}}
{{- range $ports -}}
{{- $numbers = append $numbers (include "epp.flagValue" .number) -}}
{{- end -}}
{{- $sel := join "," $selector -}}
{{- $tp := join "," $numbers -}}
{{- if $standaloneGie -}}
{{- $sel = $es.endpointSelector | default $sel -}}
{{- if $es.targetPorts -}}
{{- $tp = ternary (join "," $es.targetPorts) (include "epp.flagValue" $es.targetPorts) (kindIs "slice" $es.targetPorts) -}}
{{- end -}}
{{- end -}}
{{- if not $sel -}}
{{- fail "standalone mode (no InferencePool) renders epp's --endpoint-selector from the model servers' matchLabels: set router.modelServers.matchLabels (or inferenceExtension.endpointsServer.endpointSelector)" -}}
{{- end -}}
{{- $_ := set $s "endpointSelector" $sel -}}
{{- $_ := set $s "endpointTargetPorts" $tp -}}
{{- else if not $labels -}}
{{- fail (ternary "router.modelServers.matchLabels is required" "inferencePool.modelServers.matchLabels is required" $router) -}}
{{- end -}}
{{- $fm := $rip.failureMode | default $ip.failureMode | default $ie.failureMode | default "FailOpen" -}}
{{- if not (has $fm (list "FailOpen" "FailClose")) -}}
{{- fail (printf "failureMode %q is not one of FailOpen, FailClose" $fm) -}}
{{- end -}}
{{- $_ := set $s "failureMode" $fm -}}
{{- $_ := set $s "apiVersion" ($ip.apiVersion | default "inference.networking.k8s.io/v1") -}}
{{- $_ := set $s "objectives" (ternary $r.inferenceObjectives $v.inferenceObjectives (hasKey $r "inferenceObjectives") | default list) -}}
{{- $_ := set $s "clusterDomain" ($r.clusterDomain | default "cluster.local") -}}

{{- /* HTTPRoute: llm-d's httpRoute.create or GIE's experimentalHttpRoute.enabled. */ -}}
{{- $hr := $v.httpRoute | default dict -}}
{{- $ehr := $v.experimentalHttpRoute | default dict -}}
{{- if or $hr.create $ehr.enabled -}}
{{- if $standalone -}}
{{- fail "httpRoute: an HTTPRoute needs the InferencePool, which standalone mode does not create" -}}
{{- end -}}
{{- $route := ternary $hr $ehr (not (not $hr.create)) -}}
{{- $_ := set $s "httpRoute" (dict "gateway" ($route.inferenceGatewayName | default "inference-gateway") "gatewayNamespace" ($route.inferenceGatewayNamespace | default "") "requestTimeout" ($route.requestTimeout | default "300s") "baseModel" ($route.baseModel | default "") "headerMatches" ($route.headerMatches | default dict)) -}}
{{- end -}}

{{- /* The EndpointPickerConfig files of the ConfigMap, and which one epp reads. */ -}}
{{- $mds := ternary $re.metricsDataSource $ie.metricsDataSource (hasKey $re "metricsDataSource") -}}
{{- $parsers := list -}}
{{- if $re.parsers -}}
{{- $parsers = $re.parsers -}}
{{- else if $ip.parser -}}
{{- $parsers = list $ip.parser -}}
{{- end -}}
{{- $gen := dict "weights" $ie.scorerWeights "engine" $engine "mds" $mds "parsers" $parsers "apiVersion" (ternary "llm-d.ai/v1alpha1" "inference.networking.x-k8s.io/v1alpha1" $router) -}}
{{- $data := dict "default-plugins.yaml" (include "epp.defaultConfig" $gen) -}}
{{- if $router -}}
{{- $_ := set $data "payload-agnostic.yaml" (include "epp.payloadAgnosticConfig" .) -}}
{{- end -}}
{{- $custom := ternary $re.pluginsCustomConfig $ie.pluginsCustomConfig (hasKey $re "pluginsCustomConfig") -}}
{{- if kindIs "string" $custom -}}
{{- if $custom -}}
{{- $_ := set $data "default-plugins.yaml" $custom -}}
{{- end -}}
{{- else if kindIs "map" $custom -}}
{{- range $k, $text := $custom -}}
{{- $_ := set $data $k $text -}}
{{- end -}}
{{- else if $custom -}}
{{- fail "pluginsCustomConfig is a whole EndpointPickerConfig (text) or a map of file name to text" -}}
{{- end -}}
{{- $file := ternary $re.pluginsConfigFile ($ie.pluginsConfigFile | default "default-plugins.yaml") (hasKey $re "pluginsConfigFile") -}}
{{- if not (hasKey $data $file) -}}
{{- fail (printf "pluginsConfigFile %q is not a file of the ConfigMap (%s); add it under pluginsCustomConfig" $file (join ", " (sortAlpha (keys $data)))) -}}
{{- end -}}
{{- $_ := set $s "configFile" $file -}}
{{- $_ := set $s "configData" $data -}}
{{- toYaml $s -}}
{{- end -}}

{{- /* The chart's default EndpointPickerConfig: epp's built-in default (the affinity filter in
front of the estimated-TTFT scorer, config/examples/default.yaml), or with scorerWeights upstream's three scorers at those
weights (queue 2, kvCacheUtilization 2, prefixCache 3 is upstream's default). The data-layer
plugins (metrics-data-source, core-metrics-extractor with the engine as defaultEngine, as
llm-d-router's chart) are added when the engine is not vllm or metricsDataSource is given;
parsers when some are named. */ -}}
{{- define "epp.defaultConfig" -}}
{{- $w := .weights | default dict -}}
{{- $dl := or (ne .engine "vllm") (not (empty .mds)) -}}
{{- $m := .mds | default dict -}}
apiVersion: {{ .apiVersion }}
kind: EndpointPickerConfig
plugins:
{{- if $w }}
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
{{- else }}
- type: approx-prefix-cache-producer
  parameters:
    maxPrefixTokensToMatch: 32768
- type: prefix-cache-affinity-filter
  parameters:
    affinityThreshold: 0.80
    maxTTFTPenaltyMs: 18000
    peakPrefillThroughput: 15928
- type: estimated-ttft-scorer
  parameters:
    evictionCostWeight: 3
- type: max-score-picker
{{- end }}
{{- if $dl }}
- type: metrics-data-source
  parameters:
    scheme: {{ $m.scheme | default "http" | quote }}
    path: {{ $m.path | default "/metrics" | quote }}
    insecureSkipVerify: {{ ternary $m.insecureSkipVerify true (hasKey $m "insecureSkipVerify") }}
- type: core-metrics-extractor
{{- if ne .engine "vllm" }}
  parameters:
    defaultEngine: {{ .engine | quote }}
{{- end }}
{{- end }}
{{- range .parsers }}
- type: {{ . }}
{{- end }}
schedulingProfiles:
- name: default
  plugins:
{{- if $w }}
  - pluginRef: queue-scorer
    weight: {{ $w.queue | default 2 }}
  - pluginRef: kv-cache-utilization-scorer
    weight: {{ $w.kvCacheUtilization | default 2 }}
  - pluginRef: prefix-cache-scorer
    weight: {{ $w.prefixCache | default 3 }}
{{- else }}
  - pluginRef: prefix-cache-affinity-filter
  - pluginRef: estimated-ttft-scorer
  - pluginRef: max-score-picker
{{- end }}
{{- if .parsers }}
requestHandler:
  parsers:
  {{- range .parsers }}
  - pluginRef: {{ . }}
  {{- end }}
{{- end }}
{{- end -}}

{{- /* llm-d-router's second shipped profile (router.epp.pluginsConfigFile: payload-agnostic.yaml).
session-affinity-scorer is alpha: add router.epp.flags.allow-experimental-plugins: true. */ -}}
{{- define "epp.payloadAgnosticConfig" -}}
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: passthrough-parser
- type: active-request-scorer
- type: session-affinity-scorer
requestHandler:
  parsers:
  - pluginRef: passthrough-parser
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: active-request-scorer
    weight: 1
  - pluginRef: session-affinity-scorer
    weight: 1
{{- end -}}
