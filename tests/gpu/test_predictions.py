"""What-if on the H200: a prediction from one run against the run of the redesign."""

import pytest

pytestmark = pytest.mark.gpu

GIB = 1 << 30


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
    predicted = single.what_if["overlap:upload"]
    print(
        f"\n{shape}: single lock {single.utilization:.3f} ({single.wall_ms:.0f} ms); predicted overlap "
        f"{predicted.utilization:.3f} ({predicted.wall_ms:.0f} ms); two locks measured {two.utilization:.3f} "
        f"({two.wall_ms:.0f} ms)"
    )
    assert predicted.utilization == pytest.approx(two.utilization, abs=0.05)
    assert predicted.wall_ms == pytest.approx(two.wall_ms, rel=0.10)


def test_pageable_to_pinned_prediction_meets_the_pinned_run(gpuprof, gpu_workload):
    def batch(pinned):
        def run():
            for _ in range(4):
                gpu_workload.upload(GIB, pinned=pinned)
                gpu_workload.compute(ms=20, kind="matmul")

        return run

    pageable = gpuprof.measure(batch(False), rounds=3, warmup=1)
    pinned = gpuprof.measure(batch(True), rounds=3, warmup=1)
    predicted = pageable.what_if["pinned:upload"]
    print(
        f"\npageable {pageable.utilization:.3f} ({pageable.wall_ms:.0f} ms); predicted pinned "
        f"{predicted.utilization:.3f} ({predicted.wall_ms:.0f} ms); pinned measured {pinned.utilization:.3f} "
        f"({pinned.wall_ms:.0f} ms)"
    )
    assert predicted.utilization == pytest.approx(pinned.utilization, abs=0.05)
    assert predicted.wall_ms == pytest.approx(pinned.wall_ms, rel=0.10)
