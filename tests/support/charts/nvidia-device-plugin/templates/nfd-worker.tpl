{{- $nfd := .Values.nfd.enabled }}
{{- if or $nfd (and (kindIs "invalid" $nfd) .Values.gfd.enabled) }}
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: {{ .Release.Name }}-node-feature-discovery-worker
  namespace: {{ .Release.Namespace }}
  labels:
    app.kubernetes.io/name: node-feature-discovery
    app.kubernetes.io/instance: {{ .Release.Name }}
    role: worker
spec:
  selector:
    matchLabels:
      app.kubernetes.io/name: node-feature-discovery
      app.kubernetes.io/instance: {{ .Release.Name }}
      role: worker
  template:
    metadata:
      labels:
        app.kubernetes.io/name: node-feature-discovery
        app.kubernetes.io/instance: {{ .Release.Name }}
        role: worker
    spec:
      containers:
        - name: worker
          image: registry.k8s.io/nfd/node-feature-discovery:v0.17.3
          command: ["nfd-worker"]
{{- end }}
