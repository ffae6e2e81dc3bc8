{{/* Names and labels, the usual way. */}}
{{- define "denorm.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "denorm.fullname" -}}
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

{{- define "denorm.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "denorm.selectorLabels" -}}
app.kubernetes.io/name: {{ include "denorm.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "denorm.labels" -}}
helm.sh/chart: {{ include "denorm.chart" . }}
{{ include "denorm.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: denorm
{{- end }}

{{/* The workers' selector: the jobs carry other component labels. */}}
{{- define "denorm.workerSelectorLabels" -}}
{{ include "denorm.selectorLabels" . }}
app.kubernetes.io/component: worker
{{- end }}

{{- define "denorm.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "denorm.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "denorm.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* StatefulSet when membership is static or the index is on a volume. */}}
{{- define "denorm.statefulset" -}}
{{- if or .Values.staticMembership.enabled (eq .Values.backend "embedded") }}true{{ end }}
{{- end }}

{{/* Replicas, after the checks that keep the group sensible. */}}
{{- define "denorm.replicas" -}}
{{- if eq .Values.backend "embedded" }}1{{ else }}{{ min .Values.replicaCount .Values.kafka.partitions }}{{ end }}
{{- end }}

{{/* Refuses values that cannot work, before anything is applied. */}}
{{- define "denorm.validate" -}}
{{- if not .Values.kafka.brokers }}
{{- fail "kafka.brokers is required (host:port[,host:port...])" }}
{{- end }}
{{- if and (eq .Values.backend "elasticsearch") (not .Values.elasticsearch.url) }}
{{- fail "elasticsearch.url is required with backend elasticsearch" }}
{{- end }}
{{- if and (eq .Values.backend "embedded") .Values.autoscaling.enabled }}
{{- fail "autoscaling needs backend elasticsearch: the embedded index is one volume owned by one worker" }}
{{- end }}
{{- if and (eq .Values.backend "embedded") .Values.jobs.rebuild.enabled }}
{{- fail "the rebuild Job needs backend elasticsearch; with the embedded index run `kubectl exec` into the worker pod: denorm rebuild (docs/kubernetes.md)" }}
{{- end }}
{{- if and (eq .Values.backend "embedded") .Values.jobs.verify.enabled }}
{{- fail "the verify CronJob needs backend elasticsearch; with the embedded index run `kubectl exec` into the worker pod: denorm verify (docs/verify.md)" }}
{{- end }}
{{- if and (ne .Values.elasticsearch.auth.type "none") (not .Values.elasticsearch.auth.existingSecret) }}
{{- fail "elasticsearch.auth.existingSecret is required when elasticsearch.auth.type is not none" }}
{{- end }}
{{- /* One worker may own every partition (a rolling update, one replica):
     the kubelet evicts a pod past its emptyDir's sizeLimit, where the
     worker expects a write that fails and a partition that waits. */}}
{{- $spill := .Values.worker.spillVolumeSize | toString }}
{{- $mib := 0 }}
{{- /* values.schema.json admits digits with Ki, Mi, Gi, Ti or nothing (bytes). */}}
{{- if hasSuffix "Ti" $spill }}{{- $mib = mul (trimSuffix "Ti" $spill | int64) 1048576 }}
{{- else if hasSuffix "Gi" $spill }}{{- $mib = mul (trimSuffix "Gi" $spill | int64) 1024 }}
{{- else if hasSuffix "Mi" $spill }}{{- $mib = trimSuffix "Mi" $spill | int64 }}
{{- else if hasSuffix "Ki" $spill }}{{- $mib = div (trimSuffix "Ki" $spill | int64) 1024 }}
{{- else }}{{- $mib = div ($spill | int64) 1048576 }}
{{- end }}
{{- $need := mul (.Values.worker.spillMb | int64) (.Values.kafka.partitions | int64) }}
{{- if lt (int64 $mib) (int64 $need) }}
{{- fail (printf "worker.spillVolumeSize %s is below worker.spillMb (%d) times kafka.partitions (%d), %dMi: one worker may own every partition, and past its emptyDir's size the kubelet evicts the pod" $spill (.Values.worker.spillMb | int64) (.Values.kafka.partitions | int64) $need) }}
{{- end }}
{{- if and .Values.jobs.rebuild.changeModel .Values.jobs.rebuild.verify }}
{{- fail "jobs.rebuild.verify compares documents of one model and is refused with jobs.rebuild.changeModel: verify after the cutover (jobs.verify)" }}
{{- end }}
{{- if and .Values.jobs.rebuild.modelFile (not .Values.model.file) }}
{{- fail "jobs.rebuild.modelFile changes the model of an index written with one (model.file): the index of the compiled-in kinds alone holds no model to change" }}
{{- end }}
{{- if and .Values.jobs.rebuild.modelFile .Values.model.files (not (hasKey .Values.model.files .Values.jobs.rebuild.modelFile)) }}
{{- fail (printf "jobs.rebuild.modelFile %s is not a file of model.files (%s)" .Values.jobs.rebuild.modelFile (keys .Values.model.files | sortAlpha | join ", ")) }}
{{- end }}
{{- with .Values.model }}
{{- if and .file (not .files) (not .existingConfigMap) }}
{{- fail "model.file needs its file: in model.files (--set-file) or in the ConfigMap named by model.existingConfigMap" }}
{{- end }}
{{- if and .files .existingConfigMap }}
{{- fail "model.files and model.existingConfigMap both give the model's files: set one" }}
{{- end }}
{{- if and .files (not .file) }}
{{- fail "model.files without model.file: name the file of model.files the processes run with (--model)" }}
{{- end }}
{{- if and .files .file (not (hasKey .files .file)) }}
{{- fail (printf "model.file %s is not a file of model.files (%s)" .file (keys .files | sortAlpha | join ", ")) }}
{{- end }}
{{- if and .file (or (contains "/" .file) (hasPrefix "." .file)) }}
{{- fail (printf "model.file %s is a file name of model.files or the ConfigMap, not a path" .file) }}
{{- end }}
{{- end }}
{{- range $k, $v := .Values.kafka.options }}
{{- if or (contains "password" $k) (contains "secret" $k) (hasSuffix ".pem" $k) }}
{{- fail (printf "kafka.options.%s looks like a secret: put it in the Secret named by kafka.existingSecret" $k) }}
{{- end }}
{{- end }}
{{- end }}

{{/* librdkafka options passed in the environment: the non-secret ones from
     values, and the TLS file locations of the mounted Secret. */}}
{{- define "denorm.kafkaOptions" -}}
{{- $opts := list }}
{{- range $k, $v := .Values.kafka.options }}
{{- /* YAML numbers arrive as floats: 10000000 would print as 1e+07. */}}
{{- if and (kindIs "float64" $v) (eq (float64 (int64 $v)) $v) }}
{{- $v = int64 $v }}
{{- end }}
{{- $opts = append $opts (printf "%s=%v" $k $v) }}
{{- end }}
{{- if .Values.kafka.tls.existingSecret }}
{{- $opts = append $opts "ssl.ca.location=/var/run/secrets/denorm/kafka-tls/ca.crt" }}
{{- if .Values.kafka.tls.clientCertificate }}
{{- $opts = append $opts "ssl.certificate.location=/var/run/secrets/denorm/kafka-tls/tls.crt" }}
{{- $opts = append $opts "ssl.key.location=/var/run/secrets/denorm/kafka-tls/tls.key" }}
{{- end }}
{{- end }}
{{- join ";" $opts }}
{{- end }}

{{/* The Secret of librdkafka options of a role (.role: worker, topics,
     rebuild or verify): the Job's own jobs.<role>.kafkaSecret, else
     kafka.existingSecret. */}}
{{- define "denorm.kafkaSecret" -}}
{{- $own := "" }}
{{- if ne .role "worker" }}
{{- $own = (index .root.Values.jobs .role).kafkaSecret | default "" }}
{{- end }}
{{- default .root.Values.kafka.existingSecret $own }}
{{- end }}

{{/* The ConfigMap of the model's files, for every role but the topics Job
     (which reads no command): model.existingConfigMap, else the chart's
     own of model.files; none without model.file. */}}
{{- define "denorm.modelConfigMap" -}}
{{- if include "denorm.modelFile" . }}
{{- default (printf "%s-model" (include "denorm.fullname" .root)) .root.Values.model.existingConfigMap }}
{{- end }}
{{- end }}

{{/* The model file a role runs with: the rebuild Job's own
     jobs.rebuild.modelFile (a change of model), else model.file. */}}
{{- define "denorm.modelFile" -}}
{{- if ne .role "topics" }}
{{- $own := "" }}
{{- if eq .role "rebuild" }}
{{- $own = .root.Values.jobs.rebuild.modelFile | default "" }}
{{- end }}
{{- default .root.Values.model.file $own }}
{{- end }}
{{- end }}

{{/* The Elasticsearch credential's Secret of a role: none for the topics
     Job (it never reads the index) or without auth; the Job's own
     jobs.<role>.elasticsearchSecret, else elasticsearch.auth.existingSecret. */}}
{{- define "denorm.esSecret" -}}
{{- if and (eq .root.Values.backend "elasticsearch") (ne .root.Values.elasticsearch.auth.type "none") (ne .role "topics") }}
{{- $own := "" }}
{{- if ne .role "worker" }}
{{- $own = (index .root.Values.jobs .role).elasticsearchSecret | default "" }}
{{- end }}
{{- default .root.Values.elasticsearch.auth.existingSecret $own }}
{{- end }}
{{- end }}

{{/* The signing keys' Secret of a role: every role that reads or writes
     denorm's own messages (not the topics Job). */}}
{{- define "denorm.signingSecret" -}}
{{- if ne .role "topics" }}
{{- .root.Values.signing.existingSecret | default "" }}
{{- end }}
{{- end }}

{{/* What every denorm container needs: where the topic, the group and the
     index are, and the credentials as files. */}}
{{- define "denorm.commonEnv" -}}
{{- $kafka := include "denorm.kafkaSecret" . }}
{{- $es := include "denorm.esSecret" . }}
{{- $signing := include "denorm.signingSecret" . }}
- name: DENORM_BROKERS
  value: {{ .root.Values.kafka.brokers | quote }}
- name: DENORM_TOPIC
  value: {{ .root.Values.kafka.topic | quote }}
- name: DENORM_GROUP
  value: {{ .root.Values.kafka.group | quote }}
- name: DENORM_PARTITIONS
  value: {{ .root.Values.kafka.partitions | int64 | quote }}
- name: DENORM_REPLICATION_FACTOR
  value: {{ .root.Values.kafka.replicationFactor | int64 | quote }}
{{- with .root.Values.kafka.dlqTopic }}
- name: DENORM_DLQ_TOPIC
  value: {{ . | quote }}
{{- end }}
{{- with (include "denorm.kafkaOptions" .root) }}
- name: DENORM_KAFKA_OPTIONS
  value: {{ . | quote }}
{{- end }}
{{- if $kafka }}
- name: DENORM_KAFKA_OPTIONS_FILE
  value: /var/run/secrets/denorm/kafka/{{ .root.Values.kafka.existingSecretKey }}
{{- end }}
{{- if $signing }}
- name: DENORM_SIGNING_KEY_FILE
  value: /var/run/secrets/denorm/signing/{{ .root.Values.signing.existingSecretKey }}
{{- end }}
- name: DENORM_LOG
  value: {{ .root.Values.worker.log | quote }}
{{- if eq .root.Values.backend "embedded" }}
- name: DENORM_INDEX
  value: /data/index
{{- else }}
- name: DENORM_INDEX
  value: {{ .root.Values.elasticsearch.url | quote }}
- name: DENORM_ES_PREFIX
  value: {{ .root.Values.elasticsearch.prefix | quote }}
- name: DENORM_ES_META_SHARDS
  value: {{ .root.Values.elasticsearch.metaShards | quote }}
- name: DENORM_ES_DEDICATED_TENANTS
  value: {{ join "," .root.Values.elasticsearch.dedicatedTenants | quote }}
{{- if and $es (eq .root.Values.elasticsearch.auth.type "basic") }}
- name: DENORM_ES_USERNAME_FILE
  value: /var/run/secrets/denorm/elasticsearch/username
- name: DENORM_ES_PASSWORD_FILE
  value: /var/run/secrets/denorm/elasticsearch/password
{{- else if and $es (eq .root.Values.elasticsearch.auth.type "apiKey") }}
- name: DENORM_ES_API_KEY_ENCODED_FILE
  value: /var/run/secrets/denorm/elasticsearch/api-key
{{- end }}
{{- if .root.Values.elasticsearch.caSecret }}
- name: DENORM_ES_CA_CERT
  value: /var/run/secrets/denorm/elasticsearch-ca/ca.crt
{{- end }}
{{- end }}
{{- if include "denorm.modelConfigMap" . }}
- name: DENORM_MODEL
  value: /etc/denorm/model/{{ include "denorm.modelFile" . }}
{{- end }}
{{- with .root.Values.worker.schemaRegistryUrl }}
- name: DENORM_SCHEMA_REGISTRY_URL
  value: {{ . | quote }}
{{- end }}
{{- end }}

{{/* The Secrets, mounted read-only; /tmp is the only writable path besides
     the index volume. */}}
{{- define "denorm.secretVolumeMounts" -}}
{{- $kafka := include "denorm.kafkaSecret" . }}
{{- $es := include "denorm.esSecret" . }}
{{- $signing := include "denorm.signingSecret" . }}
- name: tmp
  mountPath: /tmp
{{- if include "denorm.modelConfigMap" . }}
- name: model
  mountPath: /etc/denorm/model
  readOnly: true
{{- end }}
{{- if $kafka }}
- name: kafka-options
  mountPath: /var/run/secrets/denorm/kafka
  readOnly: true
{{- end }}
{{- if $signing }}
- name: signing-keys
  mountPath: /var/run/secrets/denorm/signing
  readOnly: true
{{- end }}
{{- if .root.Values.kafka.tls.existingSecret }}
- name: kafka-tls
  mountPath: /var/run/secrets/denorm/kafka-tls
  readOnly: true
{{- end }}
{{- if $es }}
- name: elasticsearch-auth
  mountPath: /var/run/secrets/denorm/elasticsearch
  readOnly: true
{{- end }}
{{- if and (eq .root.Values.backend "elasticsearch") .root.Values.elasticsearch.caSecret }}
- name: elasticsearch-ca
  mountPath: /var/run/secrets/denorm/elasticsearch-ca
  readOnly: true
{{- end }}
{{- end }}

{{- define "denorm.secretVolumes" -}}
{{- $kafka := include "denorm.kafkaSecret" . }}
{{- $es := include "denorm.esSecret" . }}
{{- $signing := include "denorm.signingSecret" . }}
- name: tmp
  emptyDir:
    sizeLimit: 64Mi
{{- with include "denorm.modelConfigMap" . }}
- name: model
  configMap:
    name: {{ . }}
    defaultMode: 0444
{{- end }}
{{- if $kafka }}
- name: kafka-options
  secret:
    secretName: {{ $kafka }}
    defaultMode: 0400
    items:
      - key: {{ .root.Values.kafka.existingSecretKey }}
        path: {{ .root.Values.kafka.existingSecretKey }}
{{- end }}
{{- if .root.Values.kafka.tls.existingSecret }}
- name: kafka-tls
  secret:
    secretName: {{ .root.Values.kafka.tls.existingSecret }}
    defaultMode: 0400
{{- end }}
{{- if $signing }}
- name: signing-keys
  secret:
    secretName: {{ $signing }}
    defaultMode: 0400
    items:
      - key: {{ .root.Values.signing.existingSecretKey }}
        path: {{ .root.Values.signing.existingSecretKey }}
{{- end }}
{{- if $es }}
- name: elasticsearch-auth
  secret:
    secretName: {{ $es }}
    defaultMode: 0400
    items:
{{- if eq .root.Values.elasticsearch.auth.type "basic" }}
      - key: username
        path: username
      - key: password
        path: password
{{- else }}
      - key: api-key
        path: api-key
{{- end }}
{{- end }}
{{- if and (eq .root.Values.backend "elasticsearch") .root.Values.elasticsearch.caSecret }}
- name: elasticsearch-ca
  secret:
    secretName: {{ .root.Values.elasticsearch.caSecret }}
    defaultMode: 0444
    items:
      - key: ca.crt
        path: ca.crt
{{- end }}
{{- end }}

{{/* The pod-level settings shared by the workers and the jobs. */}}
{{- define "denorm.podCommon" -}}
automountServiceAccountToken: false
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- end }}

{{/* A one-shot denorm container (the jobs): .root is the root context,
     .role the Job's (topics, rebuild, verify), .args the command line,
     .extraEnv more variables. */}}
{{- define "denorm.jobPod" -}}
{{- $root := .root -}}
restartPolicy: Never
{{ include "denorm.podCommon" $root }}
containers:
  - name: denorm
    image: {{ include "denorm.image" $root }}
    imagePullPolicy: {{ $root.Values.image.pullPolicy }}
    args: {{ toJson .args }}
    env:
      {{- include "denorm.commonEnv" (dict "root" $root "role" .role) | nindent 6 }}
      {{- with .extraEnv }}
      {{- toYaml . | nindent 6 }}
      {{- end }}
    securityContext:
      {{- toYaml $root.Values.securityContext | nindent 6 }}
    resources:
      {{- toYaml $root.Values.jobs.resources | nindent 6 }}
    volumeMounts:
      {{- include "denorm.secretVolumeMounts" (dict "root" $root "role" .role) | nindent 6 }}
      {{- with .extraMounts }}
      {{- toYaml . | nindent 6 }}
      {{- end }}
volumes:
  {{- include "denorm.secretVolumes" (dict "root" $root "role" .role) | nindent 2 }}
  {{- with .extraVolumes }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end }}

{{/* A member's environment in an Indexed Job (`rebuild`, `verify`): how
many members, and which one this pod is (its completion index). */}}
{{- define "denorm.memberEnv" -}}
- name: {{ .prefix }}_MEMBERS
  value: {{ .members | int | toString | quote }}
- name: {{ .prefix }}_MEMBER
  valueFrom:
    fieldRef:
      fieldPath: metadata.annotations['batch.kubernetes.io/job-completion-index']
{{- end }}

{{/* The worker pods' terminationGracePeriodSeconds. */}}
{{- define "denorm.terminationGrace" -}}
{{- add (int64 .Values.worker.shutdownTimeoutSecs) (int64 .Values.terminationGraceExtraSeconds) -}}
{{- end -}}
