{{/* The chart name, shortened to the 63 characters a label value may hold. */}}
{{- define "xpyd.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Prefix of every object name: <release>-<chart>, or the release name alone if it holds the chart name. */}}
{{- define "xpyd.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Name of one component's objects: <fullname>-operator, <fullname>-controller. */}}
{{- define "xpyd.componentName" -}}
{{- printf "%s-%s" (include "xpyd.fullname" .root) .component | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels Helm's best practices ask for on every object. */}}
{{- define "xpyd.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "xpyd.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: xpyd
{{- end }}

{{/* Labels of one component's objects: the standard ones plus app.kubernetes.io/component. */}}
{{- define "xpyd.componentLabels" -}}
{{ include "xpyd.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* The immutable subset that Deployments and Services select a component's pods by. */}}
{{- define "xpyd.selectorLabels" -}}
app.kubernetes.io/name: {{ include "xpyd.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* The image both components run; the tag defaults to the chart's appVersion. */}}
{{- define "xpyd.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* Namespaces watched in mode Namespaces: the listed ones, or the release namespace. */}}
{{- define "xpyd.watchedNamespaces" -}}
{{- $namespaces := .Values.watch.namespaces | default (list .Release.Namespace) }}
{{- toJson (uniq $namespaces) }}
{{- end }}

{{/* Value combinations the schema cannot express; each failure names the value and the rule. */}}
{{- define "xpyd.validate" -}}
{{- if and (eq .Values.watch.mode "AllNamespaces") .Values.watch.namespaces }}
{{- fail (printf "watch.namespaces=%s is only used with watch.mode Namespaces; with AllNamespaces leave it empty" (toJson .Values.watch.namespaces)) }}
{{- end }}
{{- end }}

{{/* Router ServiceAccounts the operator allows (comma-separated): the chart's own, then the extra ones. */}}
{{- define "xpyd.routerAccounts" -}}
{{- $accounts := list }}
{{- if .Values.routerAccess.enabled }}
{{- $accounts = append $accounts .Values.routerAccess.serviceAccountName }}
{{- end }}
{{- join "," (uniq (concat $accounts .Values.operator.allowedRouterServiceAccounts)) }}
{{- end }}

{{/* The scope flags of both processes: --all-namespaces, or one --namespace per watched namespace. */}}
{{- define "xpyd.scopeArgs" -}}
{{- if eq .Values.watch.mode "AllNamespaces" }}
- --all-namespaces
{{- else }}
{{- range include "xpyd.watchedNamespaces" . | fromJsonArray }}
- --namespace={{ . }}
{{- end }}
{{- end }}
{{- end }}

{{/* Pod-spec fields both Deployments share: pull secrets, security context and placement. */}}
{{- define "xpyd.podCommon" -}}
{{- with .root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  {{- toYaml .root.Values.podSecurityContext | nindent 2 }}
{{- with .values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
volumes:
  - name: tmp
    emptyDir: {}
{{- end }}

{{/* Container fields both Deployments share: image, security context, resources, the writable /tmp. */}}
{{- define "xpyd.containerCommon" -}}
image: {{ include "xpyd.image" .root }}
imagePullPolicy: {{ .root.Values.image.pullPolicy }}
securityContext:
  {{- toYaml .root.Values.securityContext | nindent 2 }}
resources:
  {{- toYaml .values.resources | nindent 2 }}
volumeMounts:
  - name: tmp
    mountPath: /tmp
{{- end }}

{{/* RBAC subjects: the ServiceAccount of one component. */}}
{{- define "xpyd.subjects" -}}
- kind: ServiceAccount
  name: {{ include "xpyd.componentName" . }}
  namespace: {{ .root.Release.Namespace }}
{{- end }}
