{{/*
kubeseer's alerts as a Prometheus rule file's `groups` (the PrometheusRule's spec, and
deploy/monitoring/kubeseer-rules.yaml for Prometheus without the operator). Conventions of the
monitoring mixins: Kubeseer-prefixed names, a severity label, a one-line summary and a
description with the numbers. tests/unit/chart/promtool/ holds one promtool unit test per alert.
*/}}
{{- define "kubeseer.rules" -}}
{{- $t := .Values.prometheusRule.thresholds -}}
groups:
  - name: kubeseer.predictions
    rules:
      - alert: KubeseerPredictionErrorHigh
        # The median absolute percentage error of memory predictions against what the
        # profiler observed, per model family and GPU product, over finished attempts.
        expr: |
          histogram_quantile(0.5,
            sum by (family, gpu_product, le) (
              rate(kubeseer_feedback_prediction_absolute_error_ratio_bucket{quantity="memory"}[6h])
            )
          ) > {{ $t.predictionErrorRatio }}
        for: 30m
        labels:
          severity: warning
        annotations:
          summary: Memory predictions are far from what jobs use.
          description: >-
            The median memory prediction error of {{`{{ $labels.family }}`}} jobs on
            {{`{{ $labels.gpu_product }}`}} is {{`{{ $value | humanizePercentage }}`}} over the last
            6 hours (threshold {{ $t.predictionErrorRatio }}). Retrain on the cluster's
            observations (retraining.enabled) or check the family's models.
      - alert: KubeseerObservedMemoryAboveBound
        # A running DLJob pod's observed peak is above the calibrated upper bound the operator
        # placed it with: the slice may run out of memory.
        expr: |
          max by (namespace, dljob, pod, modelName, GPU_I_PROFILE) (
            kubeseer_profiler_pod_memory_peak_bytes
              - ignoring(bound)
            kubeseer_profiler_pod_predicted_memory_bytes{bound="upper"}
          ) > 0
        for: 1m
        labels:
          severity: warning
        annotations:
          summary: A DLJob pod uses more GPU memory than its predicted upper bound.
          description: >-
            Pod {{`{{ $labels.namespace }}`}}/{{`{{ $labels.pod }}`}} of DLJob
            {{`{{ $labels.dljob }}`}} on {{`{{ $labels.modelName }}`}}
            {{`{{ $labels.GPU_I_PROFILE }}`}} has peaked {{`{{ $value | humanize1024 }}`}}B above
            the upper bound it was placed with.
      - alert: KubeseerMemoryBoundMissRateHigh
        # The share of finished attempts whose observed peak exceeded the upper bound: the
        # calibration's coverage promise (95 %) is not kept.
        expr: |
          sum by (family, gpu_product) (increase(kubeseer_feedback_bound_exceeded_total{cause="observed"}[6h]))
            /
          sum by (family, gpu_product) (increase(kubeseer_feedback_prediction_absolute_error_ratio_count{quantity="memory"}[6h]))
            > {{ $t.boundExceededRatio }}
        for: 30m
        labels:
          severity: warning
        annotations:
          summary: Too many jobs exceed their predicted memory bound.
          description: >-
            {{`{{ $value | humanizePercentage }}`}} of the {{`{{ $labels.family }}`}} attempts on
            {{`{{ $labels.gpu_product }}`}} finished in the last 6 hours used more memory than
            their upper bound (threshold {{ $t.boundExceededRatio }}).
  - name: kubeseer.placement
    rules:
      - alert: KubeseerOOMEscalationsHigh
        expr: |
          sum(increase(kubeseer_operator_oom_escalations_total[1h])) > {{ $t.oomEscalationsPerHour }}
        for: 5m
        labels:
          severity: warning
        annotations:
          summary: Many DLJobs ran out of GPU memory and were re-placed.
          description: >-
            {{`{{ $value | humanize }}`}} out-of-memory escalations in the last hour (threshold
            {{ $t.oomEscalationsPerHour }}): predictions are too low for some jobs.
      - alert: KubeseerOOMEscalationExhausted
        expr: |
          sum(increase(kubeseer_operator_oom_escalations_total{outcome="exhausted"}[15m])) > 0
        labels:
          severity: warning
        annotations:
          summary: A DLJob failed after running out of GPU memory with no larger slice left.
          description: >-
            {{`{{ $value | humanize }}`}} DLJobs ran out of memory in the last 15 minutes and found
            no larger profile free, or reached their attempt limit; they are Failed.
      - alert: KubeseerJobsWaitingForGPUs
        # A DLJob whose devices exist but are busy gets its pod at once, and the pod waits in
        # kube-scheduler's queue; every scheduling try of it calls the extender, whose filter
        # fails each node for lack of free capacity. Tries keep coming: pods keep waiting.
        # (Pods whose GPUs come only from DRA claims never reach the extender.)
        expr: |
          sum(increase(kubeseer_extender_node_rejections_total{reason="no_free_capacity"}[15m])) > 0
        for: {{ $t.waitingFor }}
        labels:
          severity: warning
        annotations:
          summary: GPU pods have been waiting for a free GPU or MIG slice.
          description: >-
            The scheduler extender has kept failing nodes for lack of free GPU capacity for
            {{ $t.waitingFor }} ({{`{{ $value | humanize }}`}} node rejections in the last 15
            minutes): DLJob pods wait in kube-scheduler's queue. Check `kubectl get pods -A
            --field-selector=status.phase=Pending` and the cluster's free GPUs.
  - name: kubeseer.extender
    rules:
      - alert: KubeseerExtenderErrors
        expr: |
          sum(rate(kubeseer_extender_requests_total{code!="200"}[5m]))
            /
          sum(rate(kubeseer_extender_requests_total[5m]))
            > {{ $t.extenderErrorRatio }}
        for: 10m
        labels:
          severity: warning
        annotations:
          summary: The scheduler extender answers kube-scheduler with errors.
          description: >-
            {{`{{ $value | humanizePercentage }}`}} of the extender's calls failed in the last 5
            minutes (threshold {{ $t.extenderErrorRatio }}); kube-scheduler skips it
            and places GPU pods without kubeseer's memory check.
{{- end }}
