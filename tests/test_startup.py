"""fedsweep/util/startup.py: start-up without the cyclic collector, frozen after, once per process; each
case in a fresh interpreter (freezing the test process's objects would outlive the test)."""
import subprocess
import sys
import textwrap

import yaml

from conftest import tiny_raw


def python(code: str, *args: str) -> str:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.split()


def test_paused_then_frozen_once_per_process():
    out = python("""
        import gc
        from fedsweep.util.startup import end_startup, pause_collector, startup_imports
        pause_collector()
        print(gc.isenabled())
        import json, decimal                      # what start-up makes
        end_startup()
        print(gc.isenabled(), gc.get_freeze_count() > 0)
        frozen = gc.get_freeze_count()
        with startup_imports():                   # a Ray worker's next trial: start-up has ended here
            print(gc.isenabled())
        print(gc.isenabled(), gc.get_freeze_count() == frozen)
    """)
    assert out == ["False", "True", "True", "True", "True", "True"]


def test_a_collector_turned_off_elsewhere_is_left_off_and_nothing_is_frozen():
    out = python("""
        import gc
        from fedsweep.util.startup import end_startup, pause_collector
        end_startup()                             # never paused here: nothing to do
        print(gc.isenabled(), gc.get_freeze_count())
        gc.disable()                              # the process's own choice
        pause_collector()
        end_startup()
        print(gc.isenabled(), gc.get_freeze_count())
    """)
    assert out == ["True", "0", "False", "0"]


def test_an_import_error_still_ends_start_up():
    out = python("""
        import gc
        from fedsweep.util.startup import startup_imports
        try:
            with startup_imports():
                import fedsweep_no_such_module    # noqa: F401
        except ImportError:
            pass
        print(gc.isenabled(), gc.get_freeze_count() > 0)
    """)
    assert out == ["True", "True"]


def test_fedsweep_run_trains_with_the_collector_on_and_its_imports_frozen(tmp_path):
    """The `fedsweep run` command pauses the collector and train() ends start-up before training: a
    callback sees the collector on and Lightning's objects frozen while the rounds run."""
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(tiny_raw(rounds=2)))
    out = python("""
        import gc, sys
        import fedsweep.runs.run
        seen = []
        train = fedsweep.runs.run.train
        def spying_train(cfg, **kw):
            import lightning as L
            class Spy(L.Callback):
                def on_train_batch_start(self, *a):
                    seen.append((gc.isenabled(), gc.get_freeze_count() > 100_000))
            return train(cfg, **{**kw, "callbacks": [*kw.get("callbacks", ()), Spy()]})
        fedsweep.runs.run.train = spying_train
        from fedsweep.cli import entry
        sys.argv = ["fedsweep", "run", sys.argv[1], "--no-mlflow", "--quiet"]
        try:
            entry()
        except SystemExit as e:
            print("seen", e.code, len(seen), sorted(set(seen)))
    """, str(cfg))
    assert out[-5:] == ["seen", "0", "2", "[(True,", "True)]"]
