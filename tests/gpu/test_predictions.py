"""What-if on the H200: a prediction from one run against the run of the redesign."""

import pytest

pytestmark = pytest.mark.gpu

GIB = 1 << 30


def predicts(before_label, before, scenario, after_label, after):
    """``before``'s prediction of ``scenario`` is the measured ``after``: within 5 points
    of utilization and 10% of wall time."""
    predicted = before.what_if[scenario]
    print(
        f"\n{before_label} {before.utilization:.3f} ({before.wall_ms:.0f} ms); predicted {scenario} "
        f"{predicted.utilization:.3f} ({predicted.wall_ms:.0f} ms); {after_label} measured {after.utilization:.3f} "
        f"({after.wall_ms:.0f} ms)"
    )
    assert predicted.utilization == pytest.approx(after.utilization, abs=0.05)
    assert predicted.wall_ms == pytest.approx(after.wall_ms, rel=0.10)


@pytest.mark.parametrize(
    ("shape", "upload_bytes", "compute_per_upload"),
    [("seed", 4 * GIB, None), ("copy-bound", 2 * GIB, 0.5)],
)
def test_the_single_locks_overlap_prediction_meets_the_two_lock_run(
    gpu_workload, gpu_device, shape, upload_bytes, compute_per_upload
):
    compute_ms = None
    if compute_per_upload is not None:  # kernels half as long as the upload: the copy engine bounds the overlap
        compute_ms = compute_per_upload * upload_bytes / (gpu_device.h2d_gbps * 1e6)
    single = gpu_workload.partitions(n=8, upload_bytes=upload_bytes, compute_ms=compute_ms, rounds=3, warmup=1)
    two = gpu_workload.partitions(
        n=8, upload_bytes=upload_bytes, compute_ms=compute_ms, strategy="two-lock", rounds=3, warmup=1
    )
    predicts(f"{shape}: single lock", single, "overlap:upload", "two locks", two)


def test_pageable_to_pinned_prediction_meets_the_pinned_run(gpuprof, gpu_workload):
    def batch(pinned):
        def run():
            for _ in range(4):
                gpu_workload.upload(GIB, pinned=pinned)
                gpu_workload.compute(ms=20, kind="matmul")

        return run

    pageable = gpuprof.measure(batch(False), rounds=3, warmup=1)
    pinned = gpuprof.measure(batch(True), rounds=3, warmup=1)
    predicts("pageable", pageable, "pinned:upload", "pinned", pinned)
