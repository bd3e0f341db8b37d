apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ include "ndp.fullname" . }}-service-account
  namespace: {{ .Release.Namespace }}
  labels:
    {{- include "ndp.labels" . | nindent 4 }}
