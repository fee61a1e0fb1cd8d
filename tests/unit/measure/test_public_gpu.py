"""Which public out-of-memory failures another run of the same job contradicts."""

from __future__ import annotations

import dataclasses

from kubeseer.measure import public_gpu

ROW = public_gpu.TimmRow(
    model="convnet",
    gpu="RTX-PRO-6000-MAXQ",
    mode="infer",
    precision="fp16",
    channels_last=False,
    dynamo=False,
    torch="2.9",
    cuda="13.0",
    start_batch=2048,
    batch_size=1024,
    img_size=224,
    step_time_s=0.1,
    params=1_000_000,
    source="benchmark-infer-amp-nchw-pt291-cu130-pro6000maxq.csv",
)


def on(gpu: str, batch: int, **changes: object) -> public_gpu.TimmRow:
    """`ROW`'s job on `gpu` at `batch`; the desktop cards' files start at 1,024."""
    start = 2048 if gpu == ROW.gpu else 1024
    return dataclasses.replace(
        ROW, **{"gpu": gpu, "batch_size": batch, "start_batch": start} | changes
    )


def reasons(*rows: public_gpu.TimmRow) -> dict[tuple[str, int], str]:
    found = public_gpu.memory_contradictions(list(rows))
    return {(b.row.gpu, b.fail): why for b, why in found.items()}


def test_a_failure_a_quarter_of_the_memory_ran_is_not_memory_evidence():
    # 1,024 ran on 24 GB, so 1,536 needs at most 36 GB of the 96 GB card that failed there
    found = reasons(on("RTX-PRO-6000-MAXQ", 1024), on("RTX-4090", 1024))
    assert set(found) == {("RTX-PRO-6000-MAXQ", 1536)}
    assert "RTX-4090 ran batch 1024 at 224 px" in found["RTX-PRO-6000-MAXQ", 1536]


def test_a_smaller_batch_elsewhere_is_scaled_up_in_proportion_to_the_failed_one():
    # 384 on 24 GB says 1,536 needs at most 96 GB: not below the card, no contradiction
    assert reasons(on("RTX-PRO-6000-MAXQ", 1024), on("RTX-4090", 384)) == {}
    # 512 on 24 GB says at most 72 GB: 75 % of the card
    found = reasons(on("RTX-PRO-6000-MAXQ", 1024), on("RTX-4090", 512))
    assert "at most 75% of this card" in found["RTX-PRO-6000-MAXQ", 1536]


def test_cards_of_the_same_memory_disagreeing_by_one_step_stay_memory_evidence():
    # a 24 GB 3090 failing at 768 where a 24 GB 4090 ran it: within the tolerance
    failing = on("RTX-3090", 512)
    assert reasons(failing, on("RTX-4090", 768)) == {}


def test_only_the_same_job_contradicts():
    other_release = on("RTX-4090", 1024, torch="2.4")
    smaller_image = on("RTX-4090", 1024, img_size=192)
    channels_last = on("RTX-4090", 1024, channels_last=True)
    other_mode = on("RTX-4090", 1024, mode="train")
    failing = on("RTX-PRO-6000-MAXQ", 1024)
    for row in (other_release, smaller_image, channels_last, other_mode):
        assert reasons(failing, row) == {}
    # a larger image needs at least as much, so it does contradict
    assert set(reasons(failing, on("RTX-4090", 1024, img_size=288))) == {
        ("RTX-PRO-6000-MAXQ", 1536)
    }
