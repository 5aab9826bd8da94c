"""The report's sections, in the order report.md shows them; figures are drawn in this order too.

To add a table or a figure, write one module here that ends with
``SECTION = Part(name, analyse, markdown=..., figures=...)`` (``section.Part``; ``analyse``
reads the frozen ``Study`` and returns None to leave the section out) and add it to
``SECTIONS`` below. Markdown comes out between the title and "Problems"; figures under
"Figures".
"""

from __future__ import annotations

from stability.report.present.sections import (
    all_configs,
    answer,
    clip_fraction,
    clip_thresholds,
    evaluation,
    factor_effects,
    flags,
    grad_norm,
    how_sure,
    layer_norms,
    learning_rate,
    loss_heatmap,
    lr_sensitivity,
    main_effects,
    max_norm_advice,
    scaler,
    selection_rule,
    skipped_steps,
    spending,
    stability_verdicts,
    val_curves,
)
from stability.report.present.sections.section import Drawn, Part, Section

SECTIONS: tuple[Section, ...] = (
    answer.SECTION,
    factor_effects.SECTION,
    learning_rate.SECTION,
    spending.SECTION,
    selection_rule.SECTION,
    how_sure.SECTION,
    evaluation.SECTION,
    all_configs.SECTION,
    stability_verdicts.SECTION,
    clip_thresholds.SECTION,
    flags.SECTION,
    # figures only
    main_effects.SECTION,
    lr_sensitivity.SECTION,
    grad_norm.SECTION,
    clip_fraction.SECTION,
    val_curves.SECTION,
    scaler.SECTION,
    skipped_steps.SECTION,
    loss_heatmap.SECTION,
    max_norm_advice.SECTION,
    layer_norms.SECTION,
    spending.FIGURE,
)

__all__ = ["SECTIONS", "Drawn", "Part", "Section"]
