"""Record what NVML answers the profiler on a real GPU, and answer from the record.

The stand-in (`standin`) answers as NVML's documentation says; nothing has yet checked that
against a driver. A recording is the check: `Recorder` wraps the pynvml module the profiler
calls (`profiler.nvml.pynvml`) and writes down every call, its arguments and its answer or
error; `Replay` is a pynvml the profiler can be given instead, answering each call as the
record does. Run on a GPU with a training process beside it, the record holds what the agent
really sees there (device names, MIG mode, the process list and its memory, GPM's SM activity
or its absence, the errors); replayed in tests it drives the agent's own code with a driver's
answers instead of the documentation's.

Opaque values (device handles, GPM samples) are recorded as tokens: a handle the profiler
passes back is named by the call that returned it, so a replayed call is found by its function
and arguments. Calls that read a changing state (memory in use, processes, utilisation, GPM
metrics) are answered in the order recorded, the last answer repeated once they run out.

On a GPU (the device tool's, or a node's), from a checkout:

    PYTHONPATH=. python3 -m kubeseer.profiler.recording --out nvml-h200.json --samples 20

starts a CUDA training process of its own, waits until it holds memory, samples the node's
devices `--samples` times through the profiler's `Nvml`, and writes the record with the
training process's pid and its `torch.cuda` peaks beside it (docs/profiler.md).
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Final

import pynvml

from kubeseer.profiler import nvml as profiler_nvml
from kubeseer.profiler import standin

__all__ = ["Recorder", "Replay", "main", "record_node"]


class _Token:
    """A device handle of the record, by name."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<{self.name}>"


class _Sample:
    """A GPM sample buffer of a replay (its contents live in the recorded metrics)."""


_SAMPLE: Final = {"sample": True}
"""How a GPM sample is written in the record, as an argument or a result."""


def _query(query: Any) -> dict[str, list[int]]:
    """A GPM metrics query as the record keys it: the metric ids it asks for (its samples are
    scratch buffers and its outcome fields are the answer's)."""
    return {"metrics": [int(m.metricId) for m in query.metrics[: query.numMetrics]]}


class Recorder:
    """A pynvml that forwards to `target` and records each call (`calls`).

    Attributes that are not NVML functions (errors, constants, structure types) are `target`'s.
    """

    def __init__(self, target: Any) -> None:
        self._target = target
        self.calls: list[dict[str, Any]] = []
        self._handles: dict[int, str] = {}
        self._samples: set[int] = set()
        self._kept: list[Any] = []  # keeps the ids above unique while the record lives

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        if not name.startswith("nvml") or not callable(value):
            return value

        def recorded(*args: Any) -> Any:
            entry: dict[str, Any] = {"function": name, "args": [self._argument(a) for a in args]}
            self.calls.append(entry)
            try:
                result = value(*args)
            except self._target.NVMLError as error:
                entry["error"] = int(getattr(error, "value", -1))
                raise
            if name in _HANDLE_FUNCTIONS:
                self._handles[id(result)] = f"handle{len(self._handles)}"
                self._kept.append(result)
            elif name == "nvmlGpmSampleAlloc":
                self._samples.add(id(result))
                self._kept.append(result)
            entry["result"] = self._encode(result)
            return result

        return recorded

    def _argument(self, value: Any) -> Any:
        if hasattr(value, "numMetrics"):
            return _query(value)
        return self._encode(value)

    def _encode(self, value: Any) -> Any:
        if id(value) in self._handles:
            return {"token": self._handles[id(value)]}
        if id(value) in self._samples:
            return dict(_SAMPLE)
        if value is None or isinstance(value, bool | int | float | str):
            return value
        if isinstance(value, bytes):
            return value.decode()
        if isinstance(value, list | tuple):
            return [self._encode(item) for item in value]
        if hasattr(value, "numMetrics"):  # a GPM metrics answer, the samples in it aside
            return {"metrics": [self._metric(m) for m in value.metrics[: value.numMetrics]]}
        if hasattr(value, "_fields_"):
            return {name: self._encode(getattr(value, name)) for name, *_ in value._fields_}
        if hasattr(value, "__dict__"):
            return {k: self._encode(v) for k, v in vars(value).items() if not k.startswith("_")}
        raise TypeError(f"cannot record a {type(value).__name__} from NVML")

    @staticmethod
    def _metric(metric: Any) -> dict[str, Any]:
        return {
            "metricId": int(metric.metricId),
            "nvmlReturn": int(metric.nvmlReturn),
            "value": float(metric.value),
        }


_HANDLE_FUNCTIONS: Final = frozenset(
    {
        "nvmlDeviceGetHandleByIndex",
        "nvmlDeviceGetHandleByUUID",
        "nvmlDeviceGetMigDeviceHandleByIndex",
    }
)


class Replay:
    """A pynvml answering the profiler's calls from a record (`Recorder.calls`).

    Raises `NVMLError` with the recorded code where the call failed, and `LookupError` for a
    call the record never saw (the agent asked something the recording cannot answer).
    """

    NVMLError = pynvml.NVMLError
    c_nvmlGpmMetricsGet_t = standin.GpmMetricsGet  # noqa: N815 - pynvml's name
    NVML_GPM_METRICS_GET_VERSION = pynvml.NVML_GPM_METRICS_GET_VERSION
    NVML_GPM_METRIC_SM_UTIL = pynvml.NVML_GPM_METRIC_SM_UTIL

    def __init__(self, calls: Sequence[dict[str, Any]]) -> None:
        self._answers: dict[str, list[dict[str, Any]]] = {}
        for call in calls:
            self._answers.setdefault(self._key(call["function"], call["args"]), []).append(call)
        self._served: dict[str, int] = {}
        self._tokens: dict[str, _Token] = {}

    @classmethod
    def load(cls, path: Path) -> Replay:
        """A replay of the record `record_node` wrote to `path`."""
        return cls(json.loads(path.read_text())["calls"])

    @staticmethod
    def _key(function: str, args: Any) -> str:
        return json.dumps([function, args], sort_keys=True)

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if not name.startswith("nvml"):
            raise AttributeError(name)

        def answer(*args: Any) -> Any:
            key = self._key(name, [self._argument(a) for a in args])
            recorded = self._answers.get(key)
            if not recorded:
                raise LookupError(f"the NVML record has no answer to {name}{tuple(args)}")
            served = self._served.get(key, 0)
            self._served[key] = served + 1
            call = recorded[min(served, len(recorded) - 1)]
            if "error" in call:
                raise pynvml.NVMLError(call["error"])
            return self._decode(call.get("result"))

        return answer

    @staticmethod
    def _argument(arg: Any) -> Any:
        if isinstance(arg, _Token):
            return {"token": arg.name}
        if isinstance(arg, _Sample):
            return dict(_SAMPLE)
        if hasattr(arg, "numMetrics"):
            return _query(arg)
        return arg

    def _decode(self, value: Any) -> Any:
        if value == _SAMPLE:
            return _Sample()
        if isinstance(value, dict):
            if set(value) == {"token"}:
                return self._tokens.setdefault(value["token"], _Token(value["token"]))
            return SimpleNamespace(**{k: self._decode(v) for k, v in value.items()})
        if isinstance(value, list):
            return [self._decode(item) for item in value]
        return value


LOAD: Final = """
import json, sys, time, torch
device = torch.device("cuda")
model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(8)]).to(device)
optimizer = torch.optim.Adam(model.parameters())
batch = torch.randn(2048, 4096, device=device)
ready, report, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
started = time.monotonic()
while time.monotonic() - started < seconds:
    optimizer.zero_grad(set_to_none=True)
    model(batch).square().mean().backward()
    optimizer.step()
    torch.cuda.synchronize()
    open(ready, "w").close()
json.dump({"max_memory_allocated": torch.cuda.max_memory_allocated(),
           "max_memory_reserved": torch.cuda.max_memory_reserved(),
           "memory_reserved": torch.cuda.memory_reserved()}, open(report, "w"))
"""
"""The training process the record is taken beside: an MLP with Adam, a few GiB, busy SMs."""


def record_node(
    samples: int, interval_s: float, *, load_seconds: float | None = None
) -> dict[str, Any]:
    """Discover the node's devices and sample them `samples` times through the profiler's
    `Nvml`, every call recorded, while a training process of our own runs (module docstring).
    """
    load_seconds = load_seconds or samples * interval_s + 30
    with tempfile.TemporaryDirectory() as scratch:
        ready, report = Path(scratch) / "ready", Path(scratch) / "report.json"
        load = subprocess.Popen(
            [sys.executable, "-c", LOAD, str(ready), str(report), str(load_seconds)]
        )
        try:
            while not ready.exists():
                if load.poll() is not None:
                    raise RuntimeError(f"the training process exited with {load.returncode}")
                time.sleep(0.2)
            recorder = Recorder(profiler_nvml.pynvml)
            real, profiler_nvml.pynvml = profiler_nvml.pynvml, recorder  # type: ignore[assignment]
            errors: list[str] = []
            try:
                node = profiler_nvml.Nvml(on_error=lambda e: errors.append(str(e)))
                for _ in range(samples):
                    node.sample()
                    time.sleep(interval_s)
                node.close()
            finally:
                profiler_nvml.pynvml = real
        finally:
            load.wait()
        torch_peaks = json.loads(report.read_text()) if report.exists() else None
    return {
        "recorded": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "load": {"pid": load.pid, "seconds": load_seconds, "torch": torch_peaks},
        "agent_errors": errors,
        "calls": recorder.calls,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m kubeseer.profiler.recording`: record a GPU node's NVML answers."""
    parser = argparse.ArgumentParser(prog="python -m kubeseer.profiler.recording")
    parser.add_argument("--out", type=Path, required=True, help="the record (JSON)")
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between samples")
    args = parser.parse_args(argv)
    try:
        found = record_node(args.samples, args.interval)
    except (RuntimeError, pynvml.NVMLError) as e:  # no GPU, no driver, no CUDA for the load
        print(f"python -m kubeseer.profiler.recording: {e}", file=sys.stderr)
        return 2
    args.out.write_text(json.dumps(found, indent=1) + "\n")
    print(f"{len(found['calls'])} NVML calls recorded into {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
