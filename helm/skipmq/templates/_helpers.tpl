{{/* Names and labels. */}}
{{- define "skipmq.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "skipmq.fullname" -}}
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

{{- define "skipmq.peersName" -}}
{{- printf "%s-peers" (include "skipmq.fullname" . | trunc 57 | trimSuffix "-") -}}
{{- end -}}

{{- define "skipmq.selector" -}}
app.kubernetes.io/name: {{ include "skipmq.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "skipmq.labels" -}}
{{ include "skipmq.selector" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{- define "skipmq.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/*
Values decoded from JSON (the SDK, --values files) are float64: 1883 would be written by toToml
as 1883.0, which the broker's loader rejects (an integer key). Whole numbers become int64 here,
in place, through nested maps; anything else is left for the loader to judge.
*/}}
{{- define "skipmq.intify" -}}
{{- $m := . -}}
{{- range $k, $v := $m -}}
{{- if kindIs "map" $v -}}
{{- include "skipmq.intify" $v -}}
{{- else if and (kindIs "float64" $v) (eq $v (float64 (int64 $v))) -}}
{{- $_ := set $m $k (int64 $v) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "skipmq.clustered" -}}
{{- if or (gt (int .Values.replicaCount) 1) (dig "cluster" "enabled" false (.Values.config | default dict)) -}}true{{- end -}}
{{- end -}}

{{- define "skipmq.tlsHasCa" -}}
{{- if or .Values.tls.ca (and .Values.tls.existingSecret .Values.tls.existingSecretCaKey) -}}true{{- end -}}
{{- end -}}

{{- define "skipmq.authSecretName" -}}
{{- .Values.auth.existingSecret | default (printf "%s-auth" (include "skipmq.fullname" .)) -}}
{{- end -}}

{{- define "skipmq.hasPasswordFile" -}}
{{- if or .Values.auth.passwordFile (and .Values.auth.existingSecret .Values.auth.existingSecretPasswordFileKey) -}}true{{- end -}}
{{- end -}}

{{- define "skipmq.hasAclFile" -}}
{{- if or .Values.auth.aclFile (and .Values.auth.existingSecret .Values.auth.existingSecretAclFileKey) -}}true{{- end -}}
{{- end -}}

{{- define "skipmq.tlsSecretName" -}}
{{- .Values.tls.existingSecret | default (printf "%s-tls" (include "skipmq.fullname" .)) -}}
{{- end -}}

{{/*
The broker's configuration as JSON: .Values.config (keys of docs/configuration.md) with the keys
that depend on the pod layout set by the chart on top. The ConfigMap serialises it with toToml;
the StatefulSet, the Services and the probes read their ports from it, so they cannot disagree.
*/}}
{{- define "skipmq.configJson" -}}
{{- $cfg := deepCopy (.Values.config | default dict) -}}
{{- $clustered := eq (include "skipmq.clustered" .) "true" -}}
{{- $tls := dict "enabled" .Values.tls.enabled "host" "0.0.0.0" -}}
{{- if .Values.tls.enabled -}}
{{- $_ := set $tls "certfile" "/etc/skipmq/tls/tls.crt" -}}
{{- $_ := set $tls "keyfile" "/etc/skipmq/tls/tls.key" -}}
{{- if include "skipmq.tlsHasCa" . -}}
{{- $_ := set $tls "cafile" "/etc/skipmq/tls/ca.crt" -}}
{{- end -}}
{{- end -}}
{{- $listeners := dict "tcp" (dict "host" "0.0.0.0") "tls" $tls "websocket" (dict "host" "0.0.0.0") -}}
{{- $cluster := dict "enabled" $clustered -}}
{{- if $clustered -}}
{{- $port := int (dig "cluster" "port" 7883 $cfg) -}}
{{- $_ := set $cluster "host" "0.0.0.0" -}}
{{- $_ := set $cluster "join" (printf "%s.%s.svc:%d" (include "skipmq.peersName" .) .Release.Namespace $port) -}}
{{- if .Values.clusterTls.enabled -}}
{{- $_ := set $cluster "tls_ca_file" "/etc/skipmq/cluster-ca/ca.pem" -}}
{{- $_ := set $cluster "tls_cert_file" "/etc/skipmq/cluster-tls/broker.pem" -}}
{{- $_ := set $cluster "tls_key_file" "/etc/skipmq/cluster-tls/broker.key" -}}
{{- else -}}
{{- $_ := set $cluster "insecure" true -}}
{{- end -}}
{{- end -}}
{{- $auth := dict -}}
{{- if include "skipmq.hasPasswordFile" . -}}
{{- $_ := set $auth "password_file" "/etc/skipmq/auth/passwd" -}}
{{- end -}}
{{- if include "skipmq.hasAclFile" . -}}
{{- $_ := set $auth "acl_file" "/etc/skipmq/auth/acl" -}}
{{- end -}}
{{- $forced := dict "data_dir" "/var/lib/skipmq" "listeners" $listeners "http" (dict "enabled" true "host" "0.0.0.0") "cluster" $cluster "auth" $auth -}}
{{- $merged := mustMergeOverwrite $cfg $forced -}}
{{- include "skipmq.intify" $merged -}}
{{- toJson $merged -}}
{{- end -}}

{{/* Effective listener ports and switches (broker defaults where the config leaves a key out). */}}
{{- define "skipmq.ports" -}}
{{- $cfg := include "skipmq.configJson" . | fromJson -}}
{{- $l := $cfg.listeners -}}
{{- $out := dict
  "mqttEnabled" (dig "tcp" "enabled" true $l)
  "mqtt" (int (dig "tcp" "port" 1883 $l))
  "mqttsEnabled" (dig "tls" "enabled" false $l)
  "mqtts" (int (dig "tls" "port" 8883 $l))
  "wsEnabled" (dig "websocket" "enabled" false $l)
  "ws" (int (dig "websocket" "port" 8080 $l))
  "wsPath" (dig "websocket" "path" "/mqtt" $l)
  "http" (int (dig "http" "port" 9090 $cfg))
  "clusterEnabled" $cfg.cluster.enabled
  "cluster" (int (dig "cluster" "port" 7883 $cfg)) -}}
{{- toJson $out -}}
{{- end -}}

{{/* Cluster mTLS: on when clustered and clusterTls.enabled; the Secret holding the CA. */}}
{{- define "skipmq.clusterTls" -}}
{{- if and (eq (include "skipmq.clustered" .) "true") .Values.clusterTls.enabled -}}true{{- end -}}
{{- end -}}

{{- define "skipmq.clusterCaSecretName" -}}
{{- .Values.clusterTls.existingSecret | default (printf "%s-cluster-ca" (include "skipmq.fullname" .)) -}}
{{- end -}}

{{- define "skipmq.pipelineImage" -}}
{{- printf "%s:%s" .Values.pipeline.image.repository (.Values.pipeline.image.tag | default .Chart.AppVersion) -}}
{{- end -}}
