"""docs/configuration.md must be what scripts/config_reference.py prints for the current code."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_configuration_reference_is_current() -> None:
    generated = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "config_reference.py")],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    on_disk = (ROOT / "docs" / "configuration.md").read_text()
    assert on_disk == generated, "run: python scripts/config_reference.py > docs/configuration.md"
