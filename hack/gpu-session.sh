#!/usr/bin/env bash
# The checks a session with a lent GPU runs first, in one call of the device tool (a
# 10-minute command; the whole lease is 15 minutes): the device's facts, a record of NVML's
# answers to the profiler (kubeseer.profiler.recording), and the derived-memory check plan
# (kubeseer dataset check-derived) until DEADLINE_MINUTES. Everything lands in $OUT (at most
# eight files come back); a second call with the same measured.jsonl carried back into
# data/derived-check-gpu/ resumes the plan. Needs only the image's torch, timm and pynvml:
#
#   bash hack/gpu-session.sh            # as the device tool's command, timeout_s 590
set -uo pipefail
OUT=${OUT:?the device tool sets OUT}
export PYTHONPATH=. PYTHONUNBUFFERED=1
python=${PYTHON:-python3}

nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1
"$python" -c 'import torch, timm; print(torch.__version__, torch.version.cuda,
torch.backends.cudnn.version(), timm.__version__, torch.cuda.get_device_name())' \
    >"$OUT/versions.txt" 2>&1
"$python" -m kubeseer.profiler.recording --out "$OUT/nvml.json" --samples 20 \
    2>&1 | tee "$OUT/nvml.log"
measured=data/derived-check-gpu/measured.jsonl
if [ -f "$measured" ]; then cp "$measured" "$OUT/measured.jsonl"; fi
"$python" -m kubeseer.measure check-derived --plan plans/derived-check.jsonl \
    --out "$OUT/measured.jsonl" --deadline-minutes "${DEADLINE_MINUTES:-6}" --timed 5 \
    2>&1 | tee "$OUT/check-derived.log"
