"""Reading keys the way Pulsar reads ``tokenSecretKey`` / ``tokenPublicKey`` values.

A value is, in Pulsar's order: a ``data:`` URL (``data:;base64,<base64>``), a ``file:`` URL
(``file:///path``), the path of an existing file, or the key itself in base64. Anything else is
a start-up error naming the setting, never the key's content."""

from __future__ import annotations

import base64
import binascii
import urllib.parse
from pathlib import Path


class KeyConfigError(ValueError):
    """A key setting that cannot be read; the message names the setting, not the key."""


def read_key(value: str, setting: str) -> bytes:
    """The key bytes that ``value`` (the setting ``setting``) points to or holds."""
    if value.startswith("data:"):
        header, sep, data = value[len("data:") :].partition(",")
        if not sep:
            raise KeyConfigError(f"{setting}: a data: URL needs a ',' before its data")
        if header.endswith(";base64"):
            try:
                return base64.b64decode(data, validate=True)
            except binascii.Error:
                raise KeyConfigError(f"{setting}: the data: URL's base64 is not valid") from None
        return urllib.parse.unquote_to_bytes(data)
    if value.startswith("file:"):
        path = Path(urllib.parse.unquote(urllib.parse.urlparse(value).path))
        try:
            return path.read_bytes()
        except OSError as e:
            raise KeyConfigError(f"{setting}: cannot read {path}: {e.strerror}") from None
    if value and _names_a_file(value):
        return Path(value).read_bytes()
    try:
        return base64.b64decode(value, validate=True) if value else b""
    except binascii.Error:
        pass
    raise KeyConfigError(
        f"{setting}: the value ({len(value)} characters, not shown) is neither a "
        "data: or file: URL, nor an existing file, nor base64"
    )


def _names_a_file(value: str) -> bool:
    """Whether ``value`` is the path of a file; a base64 key is soon longer than a file name may
    be, which is an answer (no), not an error."""
    try:
        return Path(value).is_file()
    except OSError:
        return False
