{{/* What the operator does in a watched namespace: exactly the table "RBAC it needs" of docs/operator.md. */}}
{{- define "xpyd.operatorRules" -}}
- apiGroups: ["xpyd.dev"]
  resources: ["pddeployments"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["xpyd.dev"]
  resources: ["pddeployments/status"]
  verbs: ["patch"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "create", "patch", "delete"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- end }}

{{/* What the controller does in a watched namespace (docs/controller.md, "RBAC it needs"). */}}
{{- define "xpyd.controllerRules" -}}
- apiGroups: ["xpyd.dev"]
  resources: ["pddeployments"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["xpyd.dev"]
  resources: ["pddeployments/status"]
  verbs: ["patch"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- end }}

{{/*
One component's namespaced rules, bound where it watches: a ClusterRole + ClusterRoleBinding in mode
AllNamespaces, a Role + RoleBinding in each watched namespace otherwise. Arguments: root, component, rules.
Every object starts with its own document separator.
*/}}
{{- define "xpyd.scopedRbac" -}}
{{- $name := include "xpyd.componentName" . }}
{{- if eq .root.Values.watch.mode "AllNamespaces" }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: {{ $name }}
  labels:
    {{- include "xpyd.componentLabels" . | nindent 4 }}
rules:
  {{- include .rules . | nindent 2 }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: {{ $name }}
  labels:
    {{- include "xpyd.componentLabels" . | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: {{ $name }}
subjects:
  {{- include "xpyd.subjects" . | nindent 2 }}
{{- else }}
{{- range $namespace := include "xpyd.watchedNamespaces" .root | fromJsonArray }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: {{ $name }}
  namespace: {{ $namespace }}
  labels:
    {{- include "xpyd.componentLabels" $ | nindent 4 }}
rules:
  {{- include $.rules $ | nindent 2 }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: {{ $name }}
  namespace: {{ $namespace }}
  labels:
    {{- include "xpyd.componentLabels" $ | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: {{ $name }}
subjects:
  {{- include "xpyd.subjects" $ | nindent 2 }}
{{- end }}
{{- end }}
{{- end }}
