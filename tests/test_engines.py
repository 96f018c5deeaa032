"""The vectorized engine agrees with the loop reference on the same seed (docs/design.md §2.7)."""
import pytest

from conftest import assert_engines_agree

CASES = {
    "fedavg-stragglers": {},
    "fedlga-mean": {"algorithm": {"name": "fedlga", "reading": "projection", "damping": 0.0}},
    "fedlga-last": {"algorithm": {"name": "fedlga", "reading": "projection", "grad_source": "last"}},
    "fedlga-exact": {"algorithm": {"name": "fedlga", "grad_source": "exact"}},
    "fedlga-continuation": {"algorithm": {"name": "fedlga", "reading": "continuation", "damping": 0.0}},
    "fedlga-continuation-exact-epochs": {"local": {"steps": 3, "unit": "epochs", "batch_size": 4, "lr": 0.05},
                                         "algorithm": {"name": "fedlga", "reading": "continuation",
                                                       "grad_source": "exact"}},
    "fedlga-extrapolation-last": {"algorithm": {"name": "fedlga", "reading": "extrapolation",
                                                "grad_source": "last"}},
    "fedavg-epochs-data-weights": {"local": {"steps": 2, "unit": "epochs", "batch_size": 4, "lr": 0.1},
                                   "heterogeneity": {"kind": "uniform", "min_steps": 1},
                                   "algorithm": {"name": "fedavg", "weighting": "data"}},
    "fedlga-profiles-dropout": {"heterogeneity": {"kind": "profiles", "speeds": 1.0, "dropout": 0.3},
                                "algorithm": {"name": "fedlga"}},
    "fedavg-adam-dirichlet": {"server": {"optimizer": "adam", "lr": 0.01},
                              "data": {"name": "digits", "num_clients": 8,
                                       "partition": {"kind": "dirichlet", "alpha": 0.3}}},
}


@pytest.mark.parametrize("case", list(CASES))
def test_engines_agree(case):
    assert_engines_agree(CASES[case], ("test/accuracy", "test/loss", "train/loss", "comm/up_models", "stragglers/fraction"))
