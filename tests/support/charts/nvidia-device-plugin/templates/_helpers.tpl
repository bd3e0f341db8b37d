{{- define "ndp.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Release name, plus the chart name unless the release name already contains it. */}}
{{- define "ndp.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "ndp.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "ndp.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "ndp.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ndp.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "ndp.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "ndp.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "ndp.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default (printf "v%s" .Chart.AppVersion) }}
{{- end -}}

{{- define "ndp.configMapName" -}}
{{- if .Values.config.name -}}
{{ .Values.config.name }}
{{- else if .Values.config.map -}}
{{ include "ndp.fullname" . }}-configs
{{- end -}}
{{- end -}}

{{/* Placement shared by every DaemonSet of the chart. */}}
{{- define "ndp.placement" -}}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Environment shared by the plugin and GFD. */}}
{{- define "ndp.env" -}}
- name: NODE_NAME
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
{{- if typeIs "string" .Values.migStrategy }}
- name: MIG_STRATEGY
  value: {{ .Values.migStrategy | quote }}
{{- end }}
{{- if typeIs "bool" .Values.failOnInitError }}
- name: FAIL_ON_INIT_ERROR
  value: {{ .Values.failOnInitError | quote }}
{{- end }}
{{- if typeIs "string" .Values.deviceListStrategy }}
- name: DEVICE_LIST_STRATEGY
  value: {{ .Values.deviceListStrategy | quote }}
{{- end }}
{{- if typeIs "string" .Values.nvidiaDriverRoot }}
- name: NVIDIA_DRIVER_ROOT
  value: {{ .Values.nvidiaDriverRoot | quote }}
{{- end }}
{{- if and .Values.migStrategy (ne .Values.migStrategy "none") }}
- name: NVIDIA_MIG_MONITOR_DEVICES
  value: all
{{- end }}
{{- if include "ndp.configMapName" . }}
- name: CONFIG_FILE
  value: /config/config.yaml
- name: DEFAULT_CONFIG
  value: {{ .Values.config.default | quote }}
- name: FALLBACK_STRATEGIES
  value: {{ join "," .Values.config.fallbackStrategies | quote }}
{{- end }}
{{- end -}}
