apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: {{ include "ndp.fullname" . }}
  namespace: {{ .Release.Namespace }}
  labels:
    {{- include "ndp.labels" . | nindent 4 }}
spec:
  selector:
    matchLabels:
      {{- include "ndp.selectorLabels" . | nindent 6 }}
  {{- with .Values.updateStrategy }}
  updateStrategy:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  template:
    metadata:
      labels:
        {{- include "ndp.selectorLabels" . | nindent 8 }}
      {{- if .Values.config.map }}
      annotations:
        checksum/config: {{ toYaml .Values.config.map | sha256sum }}
      {{- end }}
    spec:
      priorityClassName: {{ .Values.priorityClassName }}
      serviceAccountName: {{ include "ndp.fullname" . }}-service-account
      {{- include "ndp.placement" . | trim | nindent 6 }}
      containers:
        - name: nvidia-device-plugin-ctr
          image: {{ include "ndp.image" . }}
          imagePullPolicy: {{ .Values.image.pullPolicy }}
          command: ["nvidia-device-plugin"]
          env:
            {{- include "ndp.env" . | nindent 12 }}
          securityContext:
            {{- if and .Values.migStrategy (ne .Values.migStrategy "none") }}
            capabilities:
              add: ["SYS_ADMIN"]
            {{- else }}
            allowPrivilegeEscalation: false
            capabilities:
              drop: ["ALL"]
            {{- end }}
          volumeMounts:
            - name: device-plugin
              mountPath: /var/lib/kubelet/device-plugins
            {{- if include "ndp.configMapName" . }}
            - name: available-configs
              mountPath: /available-configs
            {{- end }}
      volumes:
        - name: device-plugin
          hostPath:
            path: /var/lib/kubelet/device-plugins
        {{- if include "ndp.configMapName" . }}
        - name: available-configs
          configMap:
            name: {{ include "ndp.configMapName" . }}
        {{- end }}
