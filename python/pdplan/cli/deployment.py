"""Both sides as the command line describes them, and the model they serve."""

from __future__ import annotations

import argparse
import os
import re
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Literal

from pdplan._config_files import CONFIG_NAME
from pdplan._layouts import MODEL_PRESETS, ModelShape
from pdplan._model import ParallelLayout, UnsupportedPDLayoutError
from pdplan._planner import PDTransferPlanner
from pdplan._transfer_cost import model_planner
from pdplan.cli.arguments import UserError

#: Tokens a page when neither the command nor the model names one.
DEFAULT_PAGE_SIZE = 16


@dataclass(frozen=True)
class Deployment:
    """Both sides as the command line describes them."""

    prefill_tp: int
    decode_tp: int
    prefill_dp: int = 1
    decode_dp: int = 1
    kv_layout: Literal["HND", "NHD"] = "HND"
    decode_replicas: Literal["first", "all"] = "first"
    prefill_pp: int = 1
    decode_pp: int = 1
    prefill_partition: tuple[int, ...] | None = None
    decode_partition: tuple[int, ...] | None = None
    #: Tokens a page on each side; None: the model's page size.
    prefill_page_size: int | None = None
    decode_page_size: int | None = None
    #: Context parallelism: CP ranks of their own and DCP ranks inside TP, each side.
    prefill_cp: int = 1
    decode_cp: int = 1
    prefill_dcp: int = 1
    decode_dcp: int = 1
    interleave: int = 1
    cp_split: Literal["interleave", "contiguous", "zigzag"] = "interleave"
    cp_kv: Literal["sharded", "replicated"] = "sharded"

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Deployment:
        """The deployment the flags describe: each field from the flag of its name (the
        partitions from ``--prefill-pp-partition`` and ``--decode-pp-partition``)."""
        flags = {
            "prefill_partition": "prefill_pp_partition",
            "decode_partition": "decode_pp_partition",
        }
        return cls(**{f.name: getattr(args, flags.get(f.name, f.name)) for f in fields(cls)})

    def layout(
        self, role: Literal["prefill", "decode"], partition: tuple[int, ...] | None
    ) -> ParallelLayout:
        """One side's layout: CP ranks deal by --cp-split, DCP ranks always interleave."""
        tp, dp, pp, cp, dcp = (
            (self.prefill_tp, self.prefill_dp, self.prefill_pp, self.prefill_cp, self.prefill_dcp)
            if role == "prefill"
            else (self.decode_tp, self.decode_dp, self.decode_pp, self.decode_cp, self.decode_dcp)
        )
        return ParallelLayout(
            role,
            tp * dp * pp * cp,
            dp,
            pp,
            partition,
            cp_size=cp,
            dcp_size=dcp,
            cp_kv=self.cp_kv if cp > 1 else "sharded",
            cp_split=self.cp_split if cp > 1 else "interleave",
            cp_interleave=self.interleave,
        )

    def sides(self) -> tuple[ParallelLayout, ParallelLayout]:
        """Both sides' layouts, prefill first."""
        return (
            self.layout("prefill", self.prefill_partition),
            self.layout("decode", self.decode_partition),
        )

    def options(self) -> dict[str, Any]:
        """What ``model_planner`` and ``Pairing`` take beside the model and the layouts."""
        return {
            "prefill_page_size": self.prefill_page_size,
            "decode_page_size": self.decode_page_size,
            "kv_layout": self.kv_layout,
            "decode_replicas": self.decode_replicas,
        }

    def planner(self, shape: ModelShape) -> PDTransferPlanner:
        """The planner of `shape` between both sides, each side's buffers in its own page
        size (``model_planner``)."""
        return model_planner(shape, *self.sides(), **self.options())


#: A Hub repository's name (``ORG/NAME``): a path that looks like one and is not there was
#: probably meant for the Hub, which pdplan does not fetch from.
HUB_NAME = re.compile(r"[\w.-]+/[\w.-]+")


def read_config(given: str, page_size: int | None, family: str | None) -> ModelShape:
    """The model the config at `given` (a file or a model's folder) describes. Its refusals
    name the file as given (``ModelShape.from_hf_config``'s); the command adds what only a
    user of the command needs: that a Hub name is not fetched, and the flag for ``family=``."""
    try:
        return ModelShape.from_hf_config(given, page_size=page_size, family=family)
    except UnsupportedPDLayoutError as error:
        message = str(error)
        missing = message.startswith(f"cannot read {given}: no such file or folder")
        if missing and HUB_NAME.fullmatch(given) and not given.endswith(".json"):
            message += f" (pdplan fetches nothing: download a Hub model's {CONFIG_NAME} first)"
        # The core's advice names the API's argument; the command's is the flag.
        message = message.replace("family= (--family on the command)", "--family")
        message = message.replace("with family=", "with --family")
        raise UnsupportedPDLayoutError(message) from None


def shape_of(args: argparse.Namespace) -> ModelShape:
    explicit = [args.layers, args.kv_heads, args.head_dim]
    chosen = sum(x is not None for x in (args.model, args.config)) + any(
        x is not None for x in explicit
    )
    if chosen != 1:
        raise UserError(
            "give exactly one model: --model PRESET, --config PATH (a config.json or a model's "
            "folder), or --layers N --kv-heads N --head-dim N [--dtype NAME]"
        )
    if args.family is not None and not (args.config or args.model not in (None, *MODEL_PRESETS)):
        raise UserError("--family chooses the reader of a config.json; give one with --config")
    if args.model in MODEL_PRESETS:
        shape = ModelShape.preset(args.model, page_size=args.page_size or DEFAULT_PAGE_SIZE)
    elif args.model or args.config:
        shape = read_config(args.model or args.config, args.page_size, args.family)
    elif any(x is None for x in explicit):
        raise UserError("--layers, --kv-heads and --head-dim go together")
    else:
        dtype = args.dtype or "bfloat16"
        shape = ModelShape(
            args.layers, args.kv_heads, args.head_dim, dtype, args.page_size or DEFAULT_PAGE_SIZE
        )
    # The config's dtypes stand unless the command names others.
    return replace(
        shape,
        dtype=args.dtype or shape.dtype,
        kv_cache_dtype=args.kv_cache_dtype or shape.kv_cache_dtype,
        state_dtype=args.state_dtype or shape.state_dtype,
    )


def _folder_name(folder: Path) -> str:
    """A model folder's name; a snapshot in the Hugging Face cache
    (``models--ORG--NAME/snapshots/REVISION``) is named by its repository, ``ORG/NAME``."""
    repository = folder.parent.parent.name
    if folder.parent.name == "snapshots" and repository.startswith("models--"):
        return repository.removeprefix("models--").replace("--", "/")
    return folder.name


def config_name(given: str) -> str | None:
    """What the model line calls the model of the config at `given`: a folder's name, the
    folder of a file named ``config.json``, else the file's stem (``configs/llama3-70b.json``:
    ``llama3-70b``). The path is taken as written (``.`` is the current folder), its links not
    followed: the Hugging Face cache links each snapshot's ``config.json`` to a blob. The
    config's own ``_name_or_path`` is not used: it is where the config was loaded from when
    it was saved (a training run's folder, or the base model of a fine-tune), not this model."""
    path = Path(os.path.abspath(given))
    if os.path.isdir(given):
        folder = path
    elif not os.path.isfile(given):  # a pipe (``--config <(curl ...)``) names nothing
        return None
    elif path.name == CONFIG_NAME:
        folder = path.parent
    else:
        return path.stem or given
    return _folder_name(folder) or given


def model_name(args: argparse.Namespace) -> str | None:
    """What the model line calls the model: the preset, or the name of its config's path
    (``config_name``; none for a pipe)."""
    if args.model in MODEL_PRESETS:
        return str(args.model)
    path = args.model or args.config
    return None if path is None else config_name(path)


def planner_from_args(args: argparse.Namespace) -> tuple[ModelShape, PDTransferPlanner]:
    shape = shape_of(args)
    return shape, Deployment.from_args(args).planner(shape)
