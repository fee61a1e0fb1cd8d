import json

import numpy as np
import pytest
import torch
from torch_geometric.data import Data

from kubeseer.predictor import evaluate, report


def sample(family, y, mask):
    return Data(
        x=torch.zeros(1, 1),
        family=family,
        y=torch.tensor([y], dtype=torch.float64),
        y_mask=torch.tensor([mask]),
    )


SAMPLES = [
    sample("resnet", [100.0, 1.0], [True, True]),
    sample("resnet", [200.0, 2.0], [True, False]),
    sample("vit", [50.0, 4.0], [True, True]),
]
# relative errors of metric a: 0.02, 0.25, 0.08 ; metric b: 0.5, (missing), 0.0
PREDICTED = np.array([[102.0, 1.5], [150.0, 999.0], [54.0, 4.0]])


def table(**kwargs):
    return evaluate.evaluate(lambda s: PREDICTED, SAMPLES, ["a", "b"], **kwargs)


def test_mape_and_accuracy_match_hand_computed_values():
    row = table().row("a")
    assert row.n == 3
    assert row.mape == pytest.approx(100 * (0.02 + 0.25 + 0.08) / 3)
    assert row.acc5 == pytest.approx(1 / 3)
    assert row.acc10 == pytest.approx(2 / 3)


def test_missing_labels_are_not_scored():
    row = table().row("b")
    assert row.n == 2
    assert row.mape == pytest.approx(25.0)


def test_rows_per_family():
    t = table()
    assert t.row("a", "resnet").mape == pytest.approx(100 * (0.02 + 0.25) / 2)
    assert t.row("b", "resnet").n == 1
    assert t.row("a", "vit").acc10 == 1.0


def test_mean_mape_averages_the_overall_rows():
    t = table()
    assert t.mean_mape() == pytest.approx((t.row("a").mape + t.row("b").mape) / 2)


def test_coverage_counts_truths_at_or_below_the_bound():
    t = table(upper=lambda s: PREDICTED * 1.1)
    assert t.row("a").coverage == pytest.approx(2 / 3)  # 200 > 165
    assert t.row("b").coverage == pytest.approx(1.0)


def test_markdown_and_json_carry_the_same_numbers():
    t = table(label="random split")
    md = t.to_markdown()
    assert md.startswith("**random split**")
    assert f"| a | all | 3 | {t.row('a').mape:.2f} | 33.3 | 66.7 |" in md
    data = json.loads(t.to_json())
    assert data["mean_mape"] == pytest.approx(t.mean_mape())
    assert report.EvaluationTable.from_dict(data) == t


def test_prediction_shape_must_match_labels():
    with pytest.raises(ValueError, match="do not match"):
        evaluate.evaluate(lambda s: PREDICTED[:, :1], SAMPLES, ["a", "b"])


def test_unknown_row_is_a_key_error():
    with pytest.raises(KeyError):
        table().row("a", "gpt")
