{{/* What the operator may do in each namespace it serves. */}}
{{- define "tiergate.operatorNamespacedRules" -}}
- apiGroups: [tiergate.dev]
  resources: [inferencepools]
  verbs: [get, list, watch, patch, update]
- apiGroups: [tiergate.dev]
  resources: [inferencepools/status]
  verbs: [get, patch, update]
# A pool's Deployment and Service name it as their owner with blockOwnerDeletion, which clusters
# that enforce owner references (OpenShift's OwnerReferencesPermissionEnforcement) allow only
# to who may update the pool's finalizers.
- apiGroups: [tiergate.dev]
  resources: [inferencepools/finalizers]
  verbs: [update]
# The autoscaler: it scales through the scale subresource (as kubectl scale and HPAs do),
# reads the pool's pods to scrape them, and stands down for an HPA that targets the pool.
- apiGroups: [tiergate.dev]
  resources: [inferencepools/scale]
  verbs: [patch]
- apiGroups: [""]
  resources: [pods]
  verbs: [list]
- apiGroups: [autoscaling]
  resources: [horizontalpodautoscalers]
  verbs: [list]
# The sim nodes of each pool.
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, create, patch, update, delete]
- apiGroups: [""]
  resources: [services]
  verbs: [get, list, watch, create, patch, update, delete]
{{- if .Values.gatewayPool.enabled }}
# Behind a gateway: the Gateway API Inference Extension InferencePool beside the pools.
- apiGroups: [inference.networking.k8s.io]
  resources: [inferencepools]
  verbs: [get, create, patch, delete]
{{- end }}
# kopf reports handler outcomes as events, through either API.
- apiGroups: [""]
  resources: [events]
  verbs: [create, patch]
- apiGroups: [events.k8s.io]
  resources: [events]
  verbs: [create, patch]
{{- end }}
