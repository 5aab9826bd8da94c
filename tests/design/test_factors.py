"""``design.factors``: the first-class factors' registry, their order, titles and level names."""

from __future__ import annotations

from stability.core.identity import config_label
from stability.design import factors as fv


def test_the_registry_lists_clipping_accumulation_precision_in_that_order() -> None:
    assert [k.name for k in fv.FIRST_CLASS] == [fv.CLIP, fv.ACCUM, fv.PRECISION]
    assert [fv.title(k.name) for k in fv.FIRST_CLASS] == ["Clipping", "Accumulation",
                                                          "Precision"]
    assert fv.title("train.lr") == "Learning rate"
    assert fv.title("optim.weight_decay") == "optim.weight_decay"  # a plain factor: its key


def test_each_factor_owns_its_params_and_nothing_else() -> None:
    assert fv.first_class("clip.max_norm") and fv.first_class("precision.init_scale")
    assert fv.first_class("train.accum_steps")
    assert not fv.first_class("train.lr") and not fv.first_class("train.accum_stepsize")
    assert not fv.first_class("clipping")


def test_levels_are_read_from_params_as_a_config_or_mlflow_writes_them() -> None:
    clip, accum, precision = (fv.kind(n) for n in (fv.CLIP, fv.ACCUM, fv.PRECISION))
    assert clip.level({"clip.enabled": False, "clip.max_norm": 5.0}) == "off"
    assert clip.level({"clip.enabled": "True", "clip.max_norm": "5.0"}) == "max_norm 5"
    assert clip.level({"clip.enabled": True, "clip.method": "value",
                       "clip.clip_value": 0.5}) == "value 0.5"
    assert clip.level({}) == "off"
    assert accum.level({"train.accum_steps": "8"}) == "8" and accum.level({}) == "1"
    assert precision.level({"precision.name": "bf16"}) == "bf16"


def test_levels_sort_reference_first_and_are_named_for_sentences() -> None:
    def ordered(name: str, levels: list[str]) -> list[str]:
        return sorted(levels, key=lambda v: fv.sort_key(name, v))

    assert ordered(fv.CLIP, ["max_norm 10", "value 0.5", "off", "max_norm 1"]) == [
        "off", "max_norm 1", "max_norm 10", "value 0.5"]
    assert ordered(fv.ACCUM, ["8", "1", "2"]) == ["1", "2", "8"]
    assert ordered(fv.PRECISION, ["fp16", "xx", "fp32", "bf16"]) == ["fp32", "bf16", "fp16", "xx"]
    assert ordered("train.lr", ["0.1", "cosine", "0.01"]) == ["0.01", "0.1", "cosine"]
    names = [fv.level_name(f, lv) for f, lv in [(fv.CLIP, "off"), (fv.CLIP, "max_norm 5"),
                                                  (fv.ACCUM, "8"), (fv.PRECISION, "bf16"),
                                                  ("train.lr", "0.01")]]
    assert names == ["clip off", "max_norm 5", "accum 8", "bf16", "train.lr=0.01"]


def test_simplicity_is_the_decisions_tie_break() -> None:
    assert [fv.simplicity(fv.CLIP, lv, i) for i, lv in enumerate(["off", "max_norm 1"])] == [0, 1]
    assert [fv.simplicity(fv.ACCUM, lv, i) for i, lv in enumerate("1248")] == [0, 1, 2, 3]
    assert [fv.simplicity(fv.PRECISION, lv, i)
            for i, lv in enumerate(["fp32", "bf16", "fp16"])] == [0, 1, 2]
    assert fv.simplicity("train.lr", "0.1", 3) == 0
    assert [fv.precision_rank(p) for p in ("fp32", "bf16", "fp16", "fp8")] == [0, 1, 2, 3]


def test_the_selection_rules_tie_break_reads_the_registry() -> None:
    """Clipping, then precision, then accumulation: off before on, fp32 before bf16 before fp16,
    smaller accumulation; a level's simplicity among the levels the configs have."""
    assert [k.name for k in fv.TIE_BREAK] == [fv.CLIP, fv.PRECISION, fv.ACCUM]
    assert [k.simpler for k in fv.TIE_BREAK] == [
        "clip off before on", "fp32 before bf16 before fp16", "smaller train.accum_steps"]
    params = {"a": {fv.CLIP_ENABLED: True, fv.MAX_NORM: 1.0, fv.PRECISION_NAME: "fp16",
                    fv.ACCUM_STEPS: 8},
              "b": {fv.CLIP_ENABLED: "False", fv.PRECISION_NAME: "bf16", fv.ACCUM_STEPS: 2},
              "c": {fv.CLIP_ENABLED: False, fv.PRECISION_NAME: "fp32", fv.ACCUM_STEPS: 1}}
    assert fv.tie_break(params) == {"a": (1, 2, 2), "b": (0, 1, 1), "c": (0, 0, 0)}
    assert set(fv.label_keys()) == {"precision.name", "clip.enabled", "clip.method",
                                    "clip.max_norm", "clip.clip_value", "train.accum_steps"}
    assert fv.kind(fv.PRECISION).known == ("fp32", "bf16", "fp16")


def test_the_config_label_names_the_label_keys_and_nothing_else() -> None:
    """The label (``core.identity.config_label``, the run's MLflow name) and the vocabulary read
    the same keys, spelled once: each label key can change a label, another param cannot."""
    norm = {fv.CLIP_ENABLED: True, fv.CLIP_METHOD: "norm", fv.MAX_NORM: 1.0, fv.CLIP_VALUE: 0.5,
            fv.PRECISION_NAME: "fp16", fv.ACCUM_STEPS: 4, "train.lr": 0.01}
    bases = [norm, {**norm, fv.CLIP_METHOD: "value"}]
    other = {fv.CLIP_ENABLED: False, fv.CLIP_METHOD: "value", fv.MAX_NORM: 2.0,
             fv.CLIP_VALUE: 1.0, fv.PRECISION_NAME: "bf16", fv.ACCUM_STEPS: 8}
    assert set(other) == set(fv.label_keys())
    for key, value in other.items():
        assert any(config_label(b) != config_label({**b, key: value}) for b in bases), key
    assert all(config_label(b) == config_label({**b, "train.lr": 0.1}) for b in bases)
    assert config_label(norm) == "fp16 clip=1 acc=4"
