{{/* Names, labels and the pieces every pod shares. */}}

{{- define "tiergate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The release's base name; object names append a suffix to it ("-operator", "-router-metrics").
At most 48 characters, so that the longest suffix (15) keeps a name within 63, and starting
with a letter: Service names are DNS-1035 labels.
*/}}
{{- define "tiergate.fullname" -}}
{{- $fullname := "" }}
{{- if .Values.fullnameOverride }}
{{- $fullname = .Values.fullnameOverride | trunc 48 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- $fullname = .Release.Name | trunc 48 | trimSuffix "-" }}
{{- else }}
{{- $fullname = printf "%s-%s" .Release.Name $name | trunc 48 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- if not (regexMatch "^[a-z]" $fullname) }}
{{- fail (printf "the chart's objects would be named %s-...: a Service name must start with a letter; name the release so, or set fullnameOverride" $fullname) }}
{{- end }}
{{- $fullname }}
{{- end }}

{{/*
A name within 63 characters: base and suffix joined when they fit; else the base cut short and
eight hex digits of the whole name's SHA-256 before the suffix (or, for a suffix too long to
keep, in place of the name's tail), so that two long names stay apart.
Usage: include "tiergate.boundedName" (list $base "-suffix")
*/}}
{{- define "tiergate.boundedName" -}}
{{- $base := index . 0 }}
{{- $suffix := index . 1 }}
{{- $whole := printf "%s%s" $base $suffix }}
{{- if le (len $whole) 63 }}
{{- $whole }}
{{- else }}
{{- $hash := sha256sum $whole | trunc 8 }}
{{- $room := sub 63 (add (len $suffix) 9) | int }}
{{- if ge $room 8 }}
{{- printf "%s-%s%s" ($base | trunc $room | trimSuffix "-") $hash $suffix }}
{{- else }}
{{- printf "%s-%s" ($whole | trunc 54 | trimSuffix "-") $hash }}
{{- end }}
{{- end }}
{{- end }}

{{- define "tiergate.operatorName" -}}
{{ include "tiergate.fullname" . }}-operator
{{- end }}

{{- define "tiergate.routerName" -}}
{{ include "tiergate.fullname" . }}-router
{{- end }}

{{- define "tiergate.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Selector labels: stable across upgrades (a Deployment's selector is immutable). */}}
{{- define "tiergate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tiergate.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* Usage: include "tiergate.labels" (dict "root" $ "component" "router") */}}
{{- define "tiergate.labels" -}}
{{ include "tiergate.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ include "tiergate.chart" .root }}
{{- end }}

{{- define "tiergate.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}
{{- end }}

{{- define "tiergate.discoveryNamespace" -}}
{{ .Values.router.discoveryNamespace | default .Release.Namespace }}
{{- end }}

{{/*
The namespaces the operator reconciles InferencePools in, as a JSON list (read it with
fromJsonArray): operator.watchNamespaces, else the release namespace; [] with
operator.clusterWide (every namespace), which must not be combined with a list.
*/}}
{{- define "tiergate.watchedNamespaces" -}}
{{- if .Values.operator.clusterWide }}
{{- if .Values.operator.watchNamespaces }}
{{- fail "operator.clusterWide: true reconciles every namespace: leave operator.watchNamespaces empty, or set clusterWide: false to watch the listed namespaces only" }}
{{- end }}
{{- list | toJson }}
{{- else }}
{{- .Values.operator.watchNamespaces | default (list .Release.Namespace) | toJson }}
{{- end }}
{{- end }}

{{/* The namespaces whose sim nodes the chart's NetworkPolicies guard, as a JSON list. */}}
{{- define "tiergate.simNodeNamespaces" -}}
{{- if .Values.operator.clusterWide }}
{{- list (include "tiergate.discoveryNamespace" .) | toJson }}
{{- else }}
{{- include "tiergate.watchedNamespaces" . }}
{{- end }}
{{- end }}

{{/*
"true" when a gateway asks the routers' endpoint picker (router.eppPort; gatewayPool.enabled
needs it). Under NetworkPolicies its pods, gatewayPool.gatewayFrom, are the only sources let
into the picker's port and, in the discovery namespace, into the pods it picks: the picker's
TLS is server-only, so any pod that reached the port could pose as the gateway (ask for picks,
report an endpoint's failures until it is ejected). Without them the chart refuses, rather
than closing the port (a FailOpen gateway would then route past every check) or opening it to
all; peers that match every source are the explicit way to open it.
*/}}
{{- define "tiergate.gatewayPeers" -}}
{{- if or .Values.router.eppPort .Values.gatewayPool.enabled }}
{{- if and .Values.networkPolicy.enabled (not .Values.gatewayPool.gatewayFrom) }}
{{- $by := "router.eppPort" }}
{{- if .Values.gatewayPool.enabled }}{{ $by = "gatewayPool.enabled" }}{{ end }}
{{- fail (printf "%s with networkPolicy.enabled needs gatewayPool.gatewayFrom: the gateway's pods, as NetworkPolicy from peers, the only sources let into the endpoint picker's port (which cannot tell the gateway from any other caller) and into the pods it picks; to admit every source, list {namespaceSelector: {}} and {ipBlock: {cidr: 0.0.0.0/0}}, or set networkPolicy.enabled=false" $by) }}
{{- end }}
{{- "true" }}
{{- end }}
{{- end }}

{{- define "tiergate.tenantsEnabled" -}}
{{- if or .Values.router.tenants.existingSecret .Values.router.tenants.inline }}true{{ end }}
{{- end }}

{{/* Pod-level security: every pod of the chart runs non-root with the runtime's seccomp profile. */}}
{{- define "tiergate.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.runAsUser | int }}
runAsGroup: {{ .Values.runAsGroup | int }}
fsGroup: {{ .Values.runAsGroup | int }}
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* Container-level security: nothing is written outside the mounted volumes. */}}
{{- define "tiergate.containerSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.runAsUser | int }}
runAsGroup: {{ .Values.runAsGroup | int }}
readOnlyRootFilesystem: true
allowPrivilegeEscalation: false
privileged: false
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* HOME and TMPDIR point at the /tmp emptyDir: the root filesystem is read-only. */}}
{{- define "tiergate.commonEnv" -}}
- name: HOME
  value: /tmp
- name: TMPDIR
  value: /tmp
- name: PYTHONDONTWRITEBYTECODE
  value: "1"
{{- end }}

{{- define "tiergate.tmpVolume" -}}
- name: tmp
  emptyDir:
    sizeLimit: 64Mi
{{- end }}

{{- define "tiergate.tmpMount" -}}
- name: tmp
  mountPath: /tmp
{{- end }}

{{/*
The router's ledger: "postgres" when router.ledger.postgres names a database (existingSecret,
or host), else "sqlite". One SQLite file serves one router process, so several replicas,
autoscaling or several workers need PostgreSQL; these and contradictory values are refused,
each in one line naming the value to set.
*/}}
{{- define "tiergate.ledgerMode" -}}
{{- $router := .Values.router }}
{{- $pg := $router.ledger.postgres }}
{{- if and $pg.existingSecret $pg.host }}
{{- fail "router.ledger.postgres: set existingSecret (a Secret holding the whole DSN) or host, not both" }}
{{- end }}
{{- if or $pg.existingSecret $pg.host }}
{{- if and $pg.host (not $pg.passwordSecret.name) }}
{{- fail "router.ledger.postgres.host needs router.ledger.postgres.passwordSecret.name (the Secret holding the database password)" }}
{{- end }}
{{- if $router.ledger.persistence.enabled }}
{{- fail "router.ledger.persistence.enabled is for the SQLite ledger: set it to false with router.ledger.postgres" }}
{{- end }}
{{- print "postgres" }}
{{- else }}
{{- if $pg.passwordSecret.name }}
{{- fail "router.ledger.postgres.passwordSecret needs router.ledger.postgres.host (or existingSecret) to say which database" }}
{{- end }}
{{- if $pg.sslmode }}
{{- fail "router.ledger.postgres.sslmode needs router.ledger.postgres.host (with existingSecret, put sslmode in the DSN)" }}
{{- end }}
{{- if gt (int $router.replicas) 1 }}
{{- fail (printf "router.replicas: %v needs router.ledger.postgres (one ledger shared by every replica); the SQLite ledger serves one router process" $router.replicas) }}
{{- end }}
{{- if $router.autoscaling.enabled }}
{{- fail "router.autoscaling.enabled needs router.ledger.postgres (one ledger shared by every replica); the SQLite ledger serves one router process" }}
{{- end }}
{{- if gt (int $router.workers) 1 }}
{{- fail (printf "router.workers: %v needs router.ledger.postgres (one ledger shared by every worker); the SQLite ledger serves one router process" $router.workers) }}
{{- end }}
{{- print "sqlite" }}
{{- end }}
{{- end }}

{{/*
The PostgreSQL ledger's URL from router.ledger.postgres.host and the rest, without a password:
the router's driver reads it from PGPASSWORD (the passwordSecret).
*/}}
{{- define "tiergate.ledgerUrl" -}}
{{- with .Values.router.ledger.postgres -}}
postgresql://{{ .user }}@{{ .host }}:{{ int .port }}/{{ .database }}{{ with .sslmode }}?sslmode={{ . }}{{ end }}
{{- end }}
{{- end }}

{{/* Where the router reads the DSN from router.ledger.postgres.existingSecret. */}}
{{- define "tiergate.ledgerUrlFile" -}}
/etc/tiergate/ledger-url
{{- end }}
