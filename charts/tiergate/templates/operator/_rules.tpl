{{/* What the operator may do in each namespace it serves. */}}
{{- define "tiergate.operatorNamespacedRules" -}}
# kopf watches the pools and keeps its progress in their annotations (patch); the operator reads
# a pool before its resync and patches its status.
- apiGroups: [tiergate.dev]
  resources: [inferencepools]
  verbs: [get, list, watch, patch]
- apiGroups: [tiergate.dev]
  resources: [inferencepools/status]
  verbs: [patch]
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
# Each pool's Deployment and Service: read, applied (server-side apply: patch, and create when
# the object is new), deleted (a pool turned hosted); the Deployments watched for drift.
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [""]
  resources: [services]
  verbs: [get, create, patch, delete]
{{- if .Values.gatewayPool.enabled }}
# Behind a gateway: the Gateway API Inference Extension InferencePool beside the pools.
- apiGroups: [inference.networking.k8s.io]
  resources: [inferencepools]
  verbs: [create, patch, delete]
{{- end }}
# kopf reports handler outcomes as events (it creates each one; it never patches them).
- apiGroups: [""]
  resources: [events]
  verbs: [create]
- apiGroups: [events.k8s.io]
  resources: [events]
  verbs: [create]
{{- end }}
