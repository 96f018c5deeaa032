"""The sweep's views in the MLflow UI count every run: on a sweep of more than 1,000 runs (ten pages of
MLflow's runs table), each row a real browser shows holds the report's numbers for its config.

The trial runs are written into a real MLflow store as the sweep's driver writes them (its tags, params
and summary metrics), with made-up scores: training 1,000 models would test nothing more here."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import yaml

RATES = [round(0.01 * 1.1 ** i, 5) for i in range(40)]
SWEEP = {
    "name": "big", "seeds": [0, 1, 2, 3],
    "base": {"rounds": 30, "clients_per_round": 4, "data": {"name": "digits", "num_clients": 8},
             "eval": {"every": 1, "target_accuracy": 0.8}, "local": {"steps": 2}},
    "grid": {"heterogeneity.rho": [0.1, 0.9], "local.lr": RATES},
    "methods": {"fedavg": {}, "fedprox": {}, "scaffold": {}},
    "report": {"settings": ["heterogeneity.rho"], "reference": "fedavg"},
    "confirm": {"seeds": list(range(10, 20))},
}


def _record(t, seed: int, stage: str | None, rng) -> tuple[str, dict, dict, dict]:
    """(run name, tags, params, metrics) of trial ``t``'s run on ``seed``, as the driver writes them, with a
    made-up score: best near η_l = 0.1, SCAFFOLD ahead, ρ = 0.9 behind."""
    from fedsweep.runs.tracking import summary_metrics
    lr, rho = t.config.local.lr, t.config.heterogeneity.rho
    skill = {"fedavg": 0.0, "fedprox": 0.01, "scaffold": 0.03}[t.method] - 0.05 * np.log(lr / 0.1) ** 2 - 0.02 * rho
    acc = float(np.clip(0.85 + skill + 0.02 * rng.standard_normal(), 0, 1))
    rtt = int(np.clip(round(20 - 100 * skill + 3 * rng.standard_normal()), 1, 30)) if acc >= 0.8 else None
    label = f"{t.method} ρ{rho} ηl{lr}"
    tags = {"fedsweep.role": "trial", "fedsweep.sweep": "big", "fedsweep.method": t.method,
            "fedsweep.config_id": t.config_id, "fedsweep.config": label + (" confirm" if stage else ""),
            "fedsweep.status": "finished", **({"fedsweep.stage": stage} if stage else {})}
    params = {"seed": str(seed), "algorithm.name": t.method, "heterogeneity.rho": str(rho), "local.lr": str(lr)}
    summary = {"best_test_accuracy": acc, "final_test_accuracy": acc, "rounds_to_target": rtt, "rounds": 30,
               "seconds_per_round": 0.01, "target_accuracy": 0.8}
    metrics = {m.key: m.value for m in summary_metrics(summary, 0)}   # what a run's end logs
    return f"{label} s{seed}", tags, params, metrics


def _write(client, exp: str, parent: str, records) -> None:
    from mlflow.entities import Metric, Param
    for name, tags, params, metrics in records:
        run = client.create_run(exp, run_name=name, tags={**tags, "mlflow.parentRunId": parent}).info.run_id
        client.log_batch(run, metrics=[Metric(k, v, 0, 0) for k, v in metrics.items()],
                         params=[Param(k, v) for k, v in params.items()])
        client.set_terminated(run)


@pytest.mark.slow
def test_the_views_of_a_sweep_of_a_thousand_runs_show_the_reports_numbers(tmp_path, monkeypatch, fresh_home):
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("no chromium: the README's set-up installs Debian's (apt-get install chromium)")
    sync_playwright = pytest.importorskip("playwright.sync_api").sync_playwright
    from mlflow import MlflowClient
    from uiview import addresses, check_rows, report_numbers, shown_rows, ui_lines

    import fedsweep
    from fedsweep.sweep.spec import expand, load_sweep
    from test_tune import interrupt
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "big.yaml"
    path.write_text("# a big test sweep\n" + yaml.safe_dump(SWEEP))
    trials = expand(load_sweep(str(path)))
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("big", tags={"mlflow.experimentKind": "custom_model_development"})
    parent = client.create_run(exp, run_name="big", tags={"fedsweep.role": "sweep", "fedsweep.sweep": "big"}).info.run_id
    rng = np.random.default_rng(0)
    _write(client, exp, parent, [_record(t, t.seed, None, rng) for t in trials])
    from fedsweep.reports.trials import selected_configs   # what a confirm stage reruns
    chosen = selected_configs(uri, "big", "big", ["heterogeneity.rho"], "fedavg")
    by_id = {t.config_id: t for t in trials}
    _write(client, exp, parent, [_record(by_id[c], seed, "confirm", rng) for c in chosen["config_id"]
                                 for seed in SWEEP["confirm"]["seeds"]])
    assert len(trials) + 10 * len(chosen) >= 1000
    client.set_terminated(parent)
    from fedsweep.reports.view import write_view
    write_view(client, exp, load_sweep(str(path)), trials)
    report = fedsweep.report(str(path), out=tmp_path / "report")
    expected = report_numbers(report)
    assert len(expected["selected"]) == 6 and len(expected["tuning"]) == 240
    assert all(cells[1] == "10" for cells in expected["selected"].values())   # scored on the 10 confirm seeds

    ui = subprocess.Popen([sys.executable, "-m", "fedsweep.cli", "ui", str(path)], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, start_new_session=True, cwd=tmp_path, env=dict(os.environ))
    try:
        view, tuning = addresses(ui_lines(ui))[:2]
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium)
            for url, stage in ((view, "selected"), (tuning, "tuning")):
                page = browser.new_page(viewport={"width": 3200, "height": 1400})
                page.goto(url)
                rows = shown_rows(page, expected[stage])
                check_rows(rows, expected[stage])
                assert len(rows) >= min(len(expected[stage]), 10), rows
                if os.environ.get("FEDSWEEP_SCREENSHOTS"):
                    if page.get_by_role("button", name="Close").count():   # MLflow's assistant panel
                        page.get_by_role("button", name="Close").first.click()
                    page.set_viewport_size({"width": 1600, "height": 700})
                    page.screenshot(path=os.path.join(os.environ["FEDSWEEP_SCREENSHOTS"], f"mlflow_{stage}_configs.png"))
                page.close()
            browser.close()
    finally:
        interrupt(ui, 60)
    assert ui.returncode == 0
