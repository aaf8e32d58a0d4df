{{/* What the operator may do in each namespace it serves. */}}
{{- define "tiergate.operatorNamespacedRules" -}}
- apiGroups: [tiergate.dev]
  resources: [inferencepools]
  verbs: [get, list, watch, patch, update]
- apiGroups: [tiergate.dev]
  resources: [inferencepools/status]
  verbs: [get, patch, update]
# The sim nodes of each pool.
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, create, patch, update, delete]
- apiGroups: [""]
  resources: [services]
  verbs: [get, list, watch, create, patch, update, delete]
# kopf reports handler outcomes as events, through either API.
- apiGroups: [""]
  resources: [events]
  verbs: [create, patch]
- apiGroups: [events.k8s.io]
  resources: [events]
  verbs: [create, patch]
{{- end }}
