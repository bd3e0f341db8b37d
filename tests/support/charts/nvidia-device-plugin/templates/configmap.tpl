{{- if and .Values.config.map (not .Values.config.name) }}
apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ include "ndp.configMapName" . }}
  namespace: {{ .Release.Namespace }}
  labels:
    {{- include "ndp.labels" . | nindent 4 }}
data:
  {{- range $name, $contents := .Values.config.map }}
  {{ $name }}: {{ $contents | quote }}
  {{- end }}
{{- end }}
