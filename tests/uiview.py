"""What the sweep's views in the MLflow UI must show, from the report's own tables, and reading them
from the page in a real browser (tests/test_tune.py, tests/test_sweep_view.py)."""
from __future__ import annotations

import math
import time


def shown(v, rounds: bool = False) -> str:
    """A number as the view shows it: 4 significant digits, no trailing zeros (rounds: 2 decimals)."""
    return f"{round(float(v), 2) + 0.0:g}" if rounds else f"{float(v):.4g}"


def report_numbers(t) -> dict[str, dict[str, list[str]]]:
    """{"selected" | "tuning": {run name: the numbers and words its row must show}}, from the report's
    tables (``t``: what ``fedsweep.report`` returns), not from the config runs."""
    labels = t.trials[t.trials["stage"] != "confirm"].groupby("config_id")["config_label"].first().to_dict()
    target = t.configs.attrs["rule"] == "target"
    tuning = {}
    for _, r in t.configs.iterrows():
        cells = [shown(r["acc_mean"]), str(int(r["n"])), str(int(r["rank"]))]
        if target and not math.isnan(r["rtt_mean"]):
            cells.append(shown(r["rtt_mean"], rounds=True))
        tuning[labels[r["config_id"]]] = cells
    verdicts = {(c["setting"], c["method"], c["metric"] == "rounds_to_target"): c for _, c in t.comparisons.iterrows()}
    from fedsweep.reports.trials import _setting_label
    selected = {}
    for _, r in t.best.iterrows():
        cells = [shown(r["acc_ci"].mean), str(int(r["n"]))]
        if target and r["reached"]:
            cells.append(shown(r["rtt_ci"].mean, rounds=True))
        for rounds in (False, True):
            c = verdicts.get((_setting_label(r, t.best.attrs["settings"]) or "all", r["method"], rounds))
            if c is not None:
                cells += [c["verdict"], shown(c["difference"], rounds)]
        selected.setdefault(labels[r["config_id"]], []).extend(cells)
    return {"selected": selected, "tuning": tuning}


def shown_rows(page, expected: dict, timeout: float = 90) -> dict[str, str]:
    """{run name: its row's text} for the rows of the runs table the page shows, once every expected
    name that fits the first page is there (the grid draws a row's pinned and scrolled parts as
    separate .ag-row elements with the same row-index)."""
    deadline = time.time() + timeout
    want = min(len(expected), 10)
    while True:
        rows = {}
        for r in page.locator(".ag-row").all():
            index = r.get_attribute("row-index")
            text = " ".join(page.locator(f".ag-row[row-index='{index}']").all_inner_texts()).replace("\n", " ")
            name = next((n for n in sorted(expected, key=len, reverse=True) if n in text), None)
            if name is not None:
                rows[name] = text
        if len(rows) >= want:
            return rows
        assert time.time() < deadline, (len(rows), page.locator(".ag-row").all_inner_texts()[:5])
        time.sleep(1)


def check_rows(rows: dict[str, str], expected: dict) -> None:
    """Every shown row holds its config's numbers, as the report has them."""
    for name, text in rows.items():
        words = text.split()
        for cell in expected[name]:
            assert cell in words, (name, cell, text)


def ui_lines(ui, timeout: float = 120) -> list[str]:
    """The lines a started ``fedsweep ui`` prints, up to its "stop it with Ctrl-C" (its addresses among them)."""
    lines, deadline = [], time.time() + timeout
    while not lines or not lines[-1].startswith("stop it with Ctrl-C"):
        line = ui.stdout.readline()
        assert line or ui.poll() is None, "\n".join(lines)
        lines.append(line.strip())
        assert time.time() < deadline, lines
    return lines


def addresses(lines: list[str]) -> list[str]:
    """The addresses among ``fedsweep ui``'s lines, in order."""
    return [w for line in lines[1:] for w in line.split() if w.startswith("http://")]
