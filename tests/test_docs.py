"""Every config option is documented: docs/config.md is generated from the code and must be current."""
from pathlib import Path

from fedsweep.config.reference import config_reference


def test_config_reference_is_current():
    path = Path(__file__).parent.parent / "docs" / "config.md"
    assert path.read_text() == config_reference(), "run: python -m fedsweep.config.reference > docs/config.md"


def test_every_field_has_a_description():
    assert "|  |" not in config_reference().replace("| `—` |", "")
