"""``fedsweep report``: compare methods at their best configs from a sweep's MLflow runs.

``trials`` reads the runs back and picks each method's best config per setting (how the numbers are
made is its docstring), ``stats`` makes the 95% intervals and the verdicts against a reference method,
``tables`` writes the markdown tables, ``plots`` the figures, ``write`` the report's files. The names
below are the package's interface.
"""
from fedsweep.reports.plots import accuracy_curves_png, rounds_to_target_png, settings_curves_png, weights_png
from fedsweep.reports.stats import Metric, compare, comparison_table, holm, mean_ci, seed_values
from fedsweep.reports.trials import best_configs, config_table, load_trials, relative_targets, selection_rule
from fedsweep.reports.write import ReportResult, make_report, write_report

__all__ = ["Metric", "ReportResult", "accuracy_curves_png", "best_configs", "compare", "comparison_table",
           "config_table", "holm", "load_trials", "make_report", "mean_ci", "relative_targets", "rounds_to_target_png",
           "seed_values", "selection_rule", "settings_curves_png", "weights_png", "write_report"]
