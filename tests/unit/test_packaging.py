"""Every package folder must be in pyproject.toml's explicit package list, or a regular
(non-editable) install ships without it."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAPPING = {"services": "magnetar", "common": "magnetar.common", "spark": "magnetar.spark"}


def test_every_package_folder_is_listed() -> None:
    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = set()
    for folder, prefix in MAPPING.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join((prefix, *relative)))
    assert found - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"
