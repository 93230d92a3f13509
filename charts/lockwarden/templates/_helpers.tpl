{{/*
The name every object's name starts with: the release name when it contains
"lockwarden" (so `helm install lockwarden` gives the names config/default
gives), else "<release>-lockwarden"; fullnameOverride replaces it.
*/}}
{{- define "lockwarden.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The manager's ServiceAccount. */}}
{{- define "lockwarden.serviceAccountName" -}}
{{- printf "%s-controller-manager" (include "lockwarden.fullname" .) -}}
{{- end -}}

{{/* The webhook's Service. */}}
{{- define "lockwarden.webhookServiceName" -}}
{{- printf "%s-webhook-service" (include "lockwarden.fullname" .) -}}
{{- end -}}

{{/* The MutatingWebhookConfiguration. */}}
{{- define "lockwarden.webhookConfigurationName" -}}
{{- printf "%s-mutating-webhook-configuration" (include "lockwarden.fullname" .) -}}
{{- end -}}

{{/* cert-manager's Certificate and the Secret it writes. */}}
{{- define "lockwarden.certificateName" -}}
{{- printf "%s-serving-cert" (include "lockwarden.fullname" .) -}}
{{- end -}}
{{- define "lockwarden.certManagerSecretName" -}}
{{- printf "%s-webhook-server-cert-cm" (include "lockwarden.fullname" .) -}}
{{- end -}}

{{/*
The Secret of the built-in self-signed certificate. Its name is fixed in the
manager's code, whatever the release is called.
*/}}
{{- define "lockwarden.selfSignedSecretName" -}}
lockwarden-webhook-server-cert
{{- end -}}

{{/* The webhook certificate mode, checked. */}}
{{- define "lockwarden.certMode" -}}
{{- $mode := .Values.webhook.certificate.mode -}}
{{- if not (has $mode (list "self-signed" "cert-manager")) -}}
{{- fail (printf "webhook.certificate.mode is %q: valid values are \"self-signed\" (the manager makes and rotates its own certificate) and \"cert-manager\"" $mode) -}}
{{- end -}}
{{- $mode -}}
{{- end -}}

{{/* Labels on every object. */}}
{{- define "lockwarden.labels" -}}
app.kubernetes.io/name: lockwarden
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/*
The manager pods' selector: the same labels as config/manager, so that the
Services, the PodDisruptionBudget and the NetworkPolicies select the same pods
whichever way lockwarden was installed.
*/}}
{{- define "lockwarden.selectorLabels" -}}
control-plane: controller-manager
app.kubernetes.io/name: lockwarden
{{- end -}}

{{/* The manager image. */}}
{{- define "lockwarden.image" -}}
{{- $tag := default (printf "v%s" .Chart.AppVersion) .Values.image.tag -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end -}}
