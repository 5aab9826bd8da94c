"""The synthetic task: 3000 sequences, stratified 70/15/15, split by data.seed, sealed test."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
import torch

from stability.tasks.sign_sum import DataConfig, Split, make_splits, open_test_split, split_sizes

ROOT = Path(__file__).resolve().parents[2]


def _rows(split: Split) -> set[bytes]:
    return {row.numpy().tobytes() for row in split.x}


def test_default_task_sizes_and_stratified_70_15_15() -> None:
    """3000 sequences of length 30; each split keeps the overall class balance."""
    cfg = DataConfig()
    sizes = split_sizes(cfg)
    assert sum(sizes.values()) == 3000
    assert abs(sizes["val"] - 450) <= 1 and abs(sizes["test"] - 450) <= 1
    assert abs(sizes["train"] - 2100) <= 2

    splits = make_splits(cfg)
    test = open_test_split(cfg, winner="abc123")
    assert [len(splits.train), len(splits.val), len(test)] == [
        sizes["train"], sizes["val"], sizes["test"]]
    overall = float(torch.cat([splits.train.y, splits.val.y, test.y]).mean())
    for split in (splits.train, splits.val, test):
        assert split.x.shape[1:] == (30, 1) and split.x.dtype == torch.float32
        assert split.y.shape == (len(split),) and split.y.dtype == torch.float32
        assert abs(float(split.y.mean()) - overall) < 0.005


def test_label_is_sign_of_sum() -> None:
    """y == 1 exactly when the sequence sums to more than zero."""
    splits = make_splits(DataConfig(num_samples=400))
    for split in (splits.train, splits.val):
        expected = (split.x.double().sum(dim=(1, 2)) > 0).float()
        assert torch.equal(split.y, expected)
        assert 0 < float(split.y.sum()) < len(split)


def test_splits_are_disjoint() -> None:
    """No sequence appears in two splits."""
    cfg = DataConfig(num_samples=400)
    splits = make_splits(cfg)
    test = open_test_split(cfg, winner="w")
    train, val, held = _rows(splits.train), _rows(splits.val), _rows(test)
    assert len(train) + len(val) + len(held) == 400
    assert not (train & val) and not (train & held) and not (val & held)


def test_split_depends_on_data_seed_only() -> None:
    """Global torch/numpy RNG state (the training seed) never changes data or split."""
    torch.manual_seed(0)
    np.random.seed(0)
    a = make_splits(DataConfig(seed=42, num_samples=300))
    torch.manual_seed(1)
    np.random.seed(1)
    torch.rand(10)
    b = make_splits(DataConfig(seed=42, num_samples=300))
    c = make_splits(DataConfig(seed=43, num_samples=300))
    for name in ("train", "val"):
        sa, sb, sc = getattr(a, name), getattr(b, name), getattr(c, name)
        assert torch.equal(sa.x, sb.x) and torch.equal(sa.y, sb.y)
        assert not torch.equal(sa.x, sc.x)


def test_make_splits_never_returns_the_test_split() -> None:
    """Training sees train and val only: every sequence it gets is outside the sealed split,
    and together they are every sequence but the sealed ones."""
    cfg = DataConfig(num_samples=300)
    splits = make_splits(cfg)
    sealed = _rows(open_test_split(cfg, winner="w"))
    seen = _rows(splits.train) | _rows(splits.val)
    assert not seen & sealed
    assert len(seen) == cfg.num_samples - split_sizes(cfg)["test"]


@pytest.mark.parametrize("winner", ["", None])
def test_test_split_needs_a_winner(winner: str | None) -> None:
    """open_test_split refuses without a selected winner."""
    with pytest.raises(PermissionError, match="winner"):
        open_test_split(DataConfig(num_samples=300), winner=winner)  # type: ignore[arg-type]


def test_test_split_is_deterministic() -> None:
    """The sealed split is the same every time it is opened."""
    cfg = DataConfig(num_samples=300)
    a, b = open_test_split(cfg, winner="x"), open_test_split(cfg, winner="y")
    assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)


GUARDED = ("open_test_split", "sealed_test")  # the default task's door and every task's


def _references(source: str) -> list[int]:
    """Lines of ``source`` naming a guarded door (import, call, attribute, string)."""
    tree = ast.parse(source)
    lines = []
    for node in ast.walk(tree):
        hit = (
            (isinstance(node, ast.Name) and node.id in GUARDED)
            or (isinstance(node, ast.Attribute) and node.attr in GUARDED)
            or (isinstance(node, ast.alias) and node.name in GUARDED)
            or (isinstance(node, ast.Constant) and node.value in GUARDED)
        )
        if hit:
            lines.append(node.lineno)
    return lines


def test_only_the_report_opens_the_test_split() -> None:
    """Outside the task modules (the doors), only report/sealed/evaluate.py opens the test split."""
    import stability.report.sealed.evaluate as door  # its own file, wherever the report keeps it

    tasks, evaluate = ROOT / "stability" / "tasks", Path(door.__file__).resolve()
    interface = ROOT / "stability" / "core" / "task.py"  # the Task protocol declares the door
    scanned = 0
    offenders = []
    for top in ("stability", "experiments", "hydra_plugins", "examples"):
        for path in sorted((ROOT / top).rglob("*.py")) if (ROOT / top).exists() else []:
            scanned += 1
            if path.is_relative_to(tasks) or path in (evaluate, interface):
                continue
            offenders += [f"{path.relative_to(ROOT)}:{n}" for n in _references(path.read_text())]
    assert scanned > 10
    assert offenders == []
    assert _references(evaluate.read_text())  # the one door in use is still seen by the scan


@pytest.mark.parametrize("snippet", [
    "from stability.tasks.sign_sum import open_test_split",
    "from stability.tasks.sign_sum import open_test_split as peek",
    "import stability.tasks.sign_sum as d\nd.open_test_split(cfg, winner='x')",
    "getattr(data, 'open_test_split')(cfg, winner='x')",
    "task.sealed_test(winner='x')",
    "getattr(task, 'sealed_test')(winner='x')",
])
def test_scanner_finds_every_form_of_reference(snippet: str) -> None:
    """The caller scan is not vacuous: imports, attribute calls and getattr strings count."""
    assert _references(snippet)
