"""The ab-test workload: seeded, configurable, and the user's own images."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from vramdoctor.abtest.workload import WorkloadSpec, describe, image_sizes, round_images
from vramdoctor.errors import InputError


def test_same_seed_same_sizes_other_seed_other_sizes() -> None:
    a = image_sizes(WorkloadSpec(seed=3))
    assert a == image_sizes(WorkloadSpec(seed=3))
    assert a != image_sizes(WorkloadSpec(seed=4))


def test_count_rounds_and_bounds() -> None:
    spec = WorkloadSpec(count=25, rounds=3, min_side=300, max_side=900)
    sizes = image_sizes(spec)
    assert len(sizes) == 3 and all(len(r) == 25 for r in sizes)
    sides = [s for r in sizes for hw in r for s in hw]
    assert min(sides) >= 300 and max(sides) <= 900
    assert len(set(sides)) > 20  # really drawn, not constant


def test_new_sizes_each_round_versus_same_images() -> None:
    fresh = image_sizes(WorkloadSpec(rounds=3, new_sizes_each_round=True))
    same = image_sizes(WorkloadSpec(rounds=3, new_sizes_each_round=False))
    assert fresh[0] != fresh[1]
    assert same[0] == same[1] == same[2]


def test_distributions() -> None:
    fixed = image_sizes(WorkloadSpec(distribution="fixed", max_side=512, count=5, rounds=1))
    assert fixed == [[(512, 512)] * 5]
    logu = [
        s
        for hw in image_sizes(WorkloadSpec(distribution="loguniform", count=400, rounds=1))[0]
        for s in hw
    ]
    uni = [
        s
        for hw in image_sizes(WorkloadSpec(distribution="uniform", count=400, rounds=1))[0]
        for s in hw
    ]
    # log-uniform puts more mass on small sides than uniform
    assert np.median(logu) < np.median(uni)


def test_generated_images_match_sizes_and_are_deterministic() -> None:
    spec = WorkloadSpec(count=4, rounds=2, min_side=64, max_side=200)
    imgs = round_images(spec, 1)
    assert [im.shape[:2] for im in imgs] == image_sizes(spec)[1]
    assert all(im.dtype == np.uint8 and im.shape[2] == 3 for im in imgs)
    again = round_images(spec, 1)
    assert all(np.array_equal(x, y) for x, y in zip(imgs, again, strict=True))
    assert imgs[0].std() > 50  # noise, not a flat image


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"count": 0}, "--count"),
        ({"rounds": 0}, "--rounds"),
        ({"distribution": "normal"}, "--distribution"),
        ({"min_side": 900, "max_side": 100}, "--min-side"),
    ],
)
def test_bad_specs_are_input_errors(kwargs: dict, needle: str) -> None:
    with pytest.raises(InputError, match=needle):
        WorkloadSpec(**kwargs).validate()


def test_images_dir_cycles_through_the_users_images(tmp_path) -> None:
    for i, (w, h) in enumerate([(40, 30), (64, 64), (100, 20)]):
        Image.new("RGB", (w, h), (i * 50, 0, 0)).save(tmp_path / f"img{i}.png")
    Image.new("L", (10, 12)).save(tmp_path / "gray.jpg")
    (tmp_path / "notes.txt").write_text("not an image")
    spec = WorkloadSpec(count=5, rounds=2, images_dir=str(tmp_path)).validate()
    r0, r1 = round_images(spec, 0), round_images(spec, 1)
    assert [im.shape for im in r0] == [
        (12, 10, 3),
        (30, 40, 3),
        (64, 64, 3),
        (20, 100, 3),
        (12, 10, 3),
    ]
    assert r1[0].shape == (30, 40, 3)  # round 2 continues where round 1 stopped
    assert "from" in describe(spec)


def test_images_dir_errors(tmp_path) -> None:
    with pytest.raises(InputError, match="not a directory"):
        WorkloadSpec(images_dir=str(tmp_path / "missing")).validate()
    with pytest.raises(InputError, match="no image files"):
        WorkloadSpec(images_dir=str(tmp_path)).validate()
    (tmp_path / "broken.png").write_bytes(b"not a png")
    spec = WorkloadSpec(count=1, rounds=1, images_dir=str(tmp_path)).validate()
    with pytest.raises(InputError, match="cannot read image"):
        round_images(spec, 0)


def test_spec_round_trips_through_dict() -> None:
    spec = WorkloadSpec(count=7, seed=9, distribution="loguniform")
    assert WorkloadSpec.from_dict(spec.to_dict()) == spec
