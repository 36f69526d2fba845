"""One Tolerance type: a profile's [tolerance] table fills it (missing keys default), bad values are refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolkit.model import targets
from toolkit.errors import UsageError
from toolkit.model.tolerance import Tolerance


def _profile(tmp_path: Path, table: str) -> targets.TargetProfile:
    (tmp_path / "mine.toml").write_text(f'extends = "generic-x86_64"\nname = "mine"\n[tolerance]\n{table}')
    return targets.get_profile("mine", targets_dirs=(tmp_path,))


def test_profile_tolerance_feeds_the_one_type(tmp_path: Path) -> None:
    profile = _profile(tmp_path, "min_recall = 0.8\nmax_slice_error = 0.3\nmin_samples = 20\n")
    assert targets.Tolerance is Tolerance and isinstance(profile.tolerance, Tolerance)
    assert profile.tolerance.min_recall == 0.8 and profile.tolerance.max_slice_error == 0.3
    assert profile.tolerance.min_samples == 20
    base = targets.get_profile("generic-x86_64").tolerance
    assert profile.tolerance.min_cosine == base.min_cosine and profile.tolerance.min_mask_iou == Tolerance().min_mask_iou


@pytest.mark.parametrize("table, key", [("min_recall = 1.5\n", "tolerance.min_recall"),
                                        ("min_samples = 0\n", "tolerance.min_samples"),
                                        ("min_recal = 0.8\n", "min_recal")])
def test_bad_tolerance_values_are_refused(tmp_path: Path, table: str, key: str) -> None:
    with pytest.raises(UsageError) as raised:
        _profile(tmp_path, table)
    assert key in raised.value.message, raised.value.message


def test_tolerance_refuses_values_outside_their_range() -> None:
    with pytest.raises(UsageError, match="max_slice_error"):
        Tolerance(max_slice_error=2.0)
    with pytest.raises(UsageError, match="Unknown tolerance key"):
        Tolerance.from_dict({"min_cosin": 0.9})
