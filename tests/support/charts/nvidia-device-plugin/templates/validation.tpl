{{- if and (eq .Release.Namespace "default") (not .Values.allowDefaultNamespace) }}
{{- fail "Running in the 'default' namespace is not recommended. Set 'allowDefaultNamespace=true' or install into another namespace (--namespace, --create-namespace)." }}
{{- end }}
{{- if and .Values.migStrategy (not (has .Values.migStrategy (list "none" "single" "mixed"))) }}
{{- fail (printf "migStrategy must be one of none, single, mixed; got %q" .Values.migStrategy) }}
{{- end }}
{{- if and .Values.config.name .Values.config.map }}
{{- fail "Only one of 'config.name' or 'config.map' may be set." }}
{{- end }}
