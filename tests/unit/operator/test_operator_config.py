"""Operator configuration from KUBESEER_* variables."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from kubeseer.operator import config as config_mod
from kubeseer.operator.config import ConfigError, OperatorConfig


def test_an_empty_environment_gives_the_documented_defaults() -> None:
    assert OperatorConfig.from_env({}) == OperatorConfig()


def test_reads_every_kind_of_value() -> None:
    cfg = OperatorConfig.from_env(
        {
            "KUBESEER_SCHEDULER_NAME": "kubeseer-scheduler",
            "KUBESEER_MAX_ATTEMPTS": "5",
            "KUBESEER_RETRY_DELAY_S": "0.5",
            "KUBESEER_FETCH_ALLOWED_HOSTS": " 127.0.0.1, Models.Internal ,",
            "KUBESEER_PREDICTOR_CHECKPOINT": "/ckpt/seernet.pt",
            "KUBESEER_METRICS_PORT": "0",
            "KUBESEER_GPU_BACKEND": "DRA",
            "KUBESEER_CHECKPOINT_CHECK_S": "2.5",
            "UNRELATED": "ignored",
        }
    )
    assert cfg.gpu_backend is config_mod.GpuBackend.DRA
    assert cfg.checkpoint_check_s == 2.5
    assert cfg.scheduler_name == "kubeseer-scheduler"
    assert cfg.max_attempts == 5
    assert cfg.retry_delay_s == 0.5
    assert cfg.fetch_allowed_hosts == ("127.0.0.1", "models.internal")
    assert cfg.predictor_checkpoint == Path("/ckpt/seernet.pt")
    assert cfg.metrics_port == 0


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"KUBESEER_MAX_ATTEMPTS": "three"}, "KUBESEER_MAX_ATTEMPTS='three' is not valid"),
        ({"KUBESEER_MAX_ATTEMPTS": "0"}, "KUBESEER_MAX_ATTEMPTS must be at least 1"),
        ({"KUBESEER_METRICS_PORT": "70000"}, "KUBESEER_METRICS_PORT must be a port number"),
        ({"KUBESEER_RETRY_DELAY_S": "-1"}, "KUBESEER_RETRY_DELAY_S must be positive"),
        (
            {"KUBESEER_GPU_BACKEND": "nvidia"},
            "KUBESEER_GPU_BACKEND='nvidia' is not valid: expected one of auto, extended, dra",
        ),
    ],
)
def test_a_bad_value_names_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        OperatorConfig.from_env(env)


def test_every_field_has_a_parser() -> None:
    assert {f.name for f in fields(OperatorConfig)} == set(config_mod._PARSERS)
