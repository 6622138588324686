"""A model's ``config.json`` read from a path a user gives: the file itself or the model's
folder holding it. Reading is bounded (``MAX_CONFIG_BYTES``), and every refusal names the file
as it was given, not "config.json"."""

from __future__ import annotations

import os
from pathlib import Path

from pdplan import _core
from pdplan._core import UnsupportedPDLayoutError

__all__ = ["CONFIG_NAME", "QUANT_CONFIG_NAME", "config_file", "named", "read_config_text"]

#: The file a model's folder keeps its config in (Hugging Face's name for it).
CONFIG_NAME = "config.json"

#: The file ModelOpt 0.29 and older keep an export's quantization config in, beside the
#: config: read for the KV cache dtype when ``config.json`` has no quantization config.
QUANT_CONFIG_NAME = "hf_quant_config.json"


def config_file(path: str | os.PathLike[str]) -> Path:
    """The config file ``path`` names: ``path`` itself, or the ``config.json`` in the folder it
    names. Refused, naming the path and what to give instead, when there is none."""
    given = Path(path)
    if given.is_dir():
        inside = given / CONFIG_NAME
        if not inside.is_file():
            raise UnsupportedPDLayoutError(
                f"{os.fspath(path)} is a folder without a {CONFIG_NAME}: give the folder of a "
                f"Hugging Face model (the one holding its {CONFIG_NAME}) or the config file itself"
            )
        return inside
    return given


def read_config_text(file: Path, shown: str) -> str:
    """The text of the config ``file``, read to at most ``MAX_CONFIG_BYTES`` (a pipe too), as
    UTF-8. ``shown`` is how refusals name it."""
    bound = _core.MAX_CONFIG_BYTES
    try:
        with file.open("rb") as stream:
            data = stream.read(bound + 1)
    except FileNotFoundError:
        raise UnsupportedPDLayoutError(
            f"cannot read {shown}: no such file or folder; give a model's {CONFIG_NAME} or the "
            "folder holding it"
        ) from None
    except PermissionError:
        raise UnsupportedPDLayoutError(f"cannot read {shown}: permission denied") from None
    except OSError as error:
        raise UnsupportedPDLayoutError(f"cannot read {shown}: {error.strerror or error}") from None
    if len(data) > bound:
        raise UnsupportedPDLayoutError(
            f"{shown} holds more than a config does (the limit is {bound:,} bytes, "
            f"pdplan.limits.MAX_CONFIG_BYTES): give the model's {CONFIG_NAME}"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise UnsupportedPDLayoutError(
            f"cannot read {shown}: {error}; a config is JSON in UTF-8: give the model's "
            f"{CONFIG_NAME}"
        ) from None


def named(error: UnsupportedPDLayoutError, shown: str) -> UnsupportedPDLayoutError:
    """The core's refusal of a config, which calls any config ``config.json``, naming the file
    as it was given."""
    message = str(error)
    if message.startswith(CONFIG_NAME):
        message = shown + message[len(CONFIG_NAME) :]
    return UnsupportedPDLayoutError(message)
