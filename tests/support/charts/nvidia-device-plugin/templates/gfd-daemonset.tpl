{{- if .Values.gfd.enabled }}
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: {{ include "ndp.fullname" . }}-gpu-feature-discovery
  namespace: {{ .Release.Namespace }}
  labels:
    {{- include "ndp.labels" . | nindent 4 }}
spec:
  selector:
    matchLabels:
      app.kubernetes.io/name: {{ include "ndp.name" . }}-gpu-feature-discovery
      app.kubernetes.io/instance: {{ .Release.Name }}
  {{- with .Values.updateStrategy }}
  updateStrategy:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  template:
    metadata:
      labels:
        app.kubernetes.io/name: {{ include "ndp.name" . }}-gpu-feature-discovery
        app.kubernetes.io/instance: {{ .Release.Name }}
    spec:
      priorityClassName: {{ .Values.priorityClassName }}
      serviceAccountName: {{ include "ndp.fullname" . }}-service-account
      {{- include "ndp.placement" . | trim | nindent 6 }}
      containers:
        - name: gpu-feature-discovery-ctr
          image: {{ include "ndp.image" . }}
          imagePullPolicy: {{ .Values.image.pullPolicy }}
          command: ["gpu-feature-discovery"]
          env:
            {{- include "ndp.env" . | nindent 12 }}
          securityContext:
            privileged: true
          volumeMounts:
            - name: output-dir
              mountPath: /etc/kubernetes/node-feature-discovery/features.d
            - name: config
              mountPath: /config
            {{- if include "ndp.configMapName" . }}
            - name: available-configs
              mountPath: /available-configs
            {{- end }}
      volumes:
        - name: output-dir
          hostPath:
            path: /etc/kubernetes/node-feature-discovery/features.d
            type: DirectoryOrCreate
        # GFD keeps its rendered config in an emptyDir, as upstream does; drains
        # therefore see local storage on GFD pods.
        - name: config
          emptyDir: {}
        {{- if include "ndp.configMapName" . }}
        - name: available-configs
          configMap:
            name: {{ include "ndp.configMapName" . }}
        {{- end }}
{{- end }}
